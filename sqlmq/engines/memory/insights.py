"""The read-only views on the in-memory engine: the model of
:mod:`sqlmq.engines.sql.insights`, same filters, same order, same windows."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ...lifecycle import State
from ...search import matches, searchable_text
from ...views import ArchiveQuery, BucketCount, MessageView, WindowCount, bucket_index
from .browse import archive_matches, live_view


class MemoryInsights:
    """The view half of the engine contract for :class:`~.engine.MemoryEngine`."""

    _lock: threading.Lock
    _store: Any
    _now: Any

    async def message_view(self, msg_id: int) -> MessageView | None:
        with self._lock:
            r = self._store.rows.get(msg_id)
            if r is not None:
                return live_view(r, self._now())
            a = self._store.archive.get(msg_id)
            return None if a is None else _archived(a)

    async def search_archive(self, query: ArchiveQuery) -> list[MessageView]:
        with self._lock:
            found = [a for a in self._store.archive.values() if _matches(a, query)]
        found.sort(key=lambda a: (a.archived_at, a.id), reverse=True)
        return [_archived(a) for a in found[:query.limit]]

    async def search_archive_text(self, words: Sequence[str], limit: int,
                                  before: int | None = None) -> list[MessageView]:
        with self._lock:  # no index: a scan, as a process's own archive is small
            found = [a for a in self._store.archive.values()
                     if (before is None or a.id < before)
                     and matches(words, searchable_text(a.headers, a.error))]
        found.sort(key=lambda a: a.id, reverse=True)
        return [_archived(a) for a in found[:limit]]

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

    async def archive_buckets(self, span: float, step: float,
                              queue: str | None = None) -> list[BucketCount]:
        counted = {State.COMPLETED, State.FAILED, State.CANCELLED, State.EXPIRED}
        with self._lock:
            now = self._now()
            archived = list(self._store.archive.values())
        counts: dict[tuple[str, int], dict[str, int]] = {}
        for a in archived:
            age = (now - a.archived_at).total_seconds()
            if a.state not in counted or age > span or queue not in (None, a.queue):
                continue
            c = counts.setdefault((a.queue, bucket_index(age / step, span, step)), {})
            c[a.state.lower()] = c.get(a.state.lower(), 0) + 1
            c["retried"] = c.get("retried", 0) + (a.deliveries_count > 1)
        return [BucketCount(q, i, **c) for (q, i), c in sorted(counts.items())]

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
    return archive_matches(a, q) and (q.after is None or (a.archived_at, a.id) < q.after)


def _archived(a: Any) -> MessageView:
    return MessageView(a.id, a.queue, a.state, dict(a.headers), a.payload, a.priority,
                       a.attempts_count, a.deliveries_count, a.created_at, a.archived_at,
                       None, None, a.error, _entries(a.history), a.channel, a.result,
                       first_attempt_at=a.first_attempt_at)


def _entries(history: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [dict(e) for e in history or ()]


__all__ = ["MemoryInsights"]
