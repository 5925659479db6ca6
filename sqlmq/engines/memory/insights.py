"""The read-only views on the in-memory engine: the model of
:mod:`sqlmq.engines.sql.insights`, same filters, same order, same windows."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ...lifecycle import State
from ...views import ArchiveQuery, MessageView, WindowCount


class MemoryInsights:
    """The view half of the engine contract for :class:`~.engine.MemoryEngine`."""

    _lock: threading.Lock
    _store: Any
    _now: Any

    async def message_view(self, msg_id: int) -> MessageView | None:
        with self._lock:
            r = self._store.rows.get(msg_id)
            if r is not None:
                return MessageView(
                    r.id, r.queue, r.state, dict(r.headers), r.payload, r.priority,
                    r.attempts_count, r.deliveries_count, r.created_at, None,
                    r.next_attempt_at or r.channel_due_at, r.lease_expires_at, r.last_error,
                    _entries(r.history), r.channel)
            a = self._store.archive.get(msg_id)
            return None if a is None else _archived(a)

    async def search_archive(self, query: ArchiveQuery) -> list[MessageView]:
        with self._lock:
            found = [a for a in self._store.archive.values() if _matches(a, query)]
        found.sort(key=lambda a: (a.archived_at, a.id), reverse=True)
        return [_archived(a) for a in found[:query.limit]]

    async def archive_activity(self, windows: Sequence[float]) -> list[WindowCount]:
        counted = {State.COMPLETED, State.FAILED, State.CANCELLED, State.EXPIRED}
        with self._lock:
            now = self._now()
            archived = list(self._store.archive.values())
        counts: dict[tuple[str, float], dict[str, int]] = {}
        widest = max(windows)
        for a in archived:
            if a.state not in counted or a.archived_at < now - timedelta(seconds=widest):
                continue
            for window in windows:
                c = counts.setdefault((a.queue, window), {})
                recent = a.archived_at >= now - timedelta(seconds=window)
                key = a.state.lower()
                c[key] = c.get(key, 0) + recent
                c["retried"] = c.get("retried", 0) + (recent and a.deliveries_count > 1)
        return [WindowCount(q, w, **c) for (q, w), c in sorted(counts.items())]

    async def latency_sample(self, queue: str, window: float, limit: int) -> list[float]:
        with self._lock:
            since = self._now() - timedelta(seconds=window)
            done = [a for a in self._store.archive.values()
                    if a.queue == queue and a.state == State.COMPLETED and a.archived_at >= since]
        done.sort(key=lambda a: a.archived_at, reverse=True)
        return [max(0.0, (a.archived_at - a.created_at).total_seconds()) for a in done[:limit]]

    async def delivery_counts(self, queue: str) -> dict[int, int]:
        counts: dict[int, int] = {}
        with self._lock:
            for r in self._store.by_queue.get(queue, {}).values():
                counts[r.deliveries_count] = counts.get(r.deliveries_count, 0) + 1
        return counts


def _matches(a: Any, q: ArchiveQuery) -> bool:
    return ((q.queue is None or a.queue == q.queue)
            and (not q.states or a.state in q.states)
            and (not q.error_contains or (a.error is not None and q.error_contains in a.error))
            and (q.archived_from is None or a.archived_at >= q.archived_from)
            and (q.archived_to is None or a.archived_at < q.archived_to)
            and (q.after is None or (a.archived_at, a.id) < q.after))


def _archived(a: Any) -> MessageView:
    return MessageView(a.id, a.queue, a.state, dict(a.headers), a.payload, a.priority,
                       a.attempts_count, a.deliveries_count, a.created_at, a.archived_at,
                       None, None, a.error, _entries(a.history), a.channel, a.result)


def _entries(history: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [dict(e) for e in history or ()]


__all__ = ["MemoryInsights"]
