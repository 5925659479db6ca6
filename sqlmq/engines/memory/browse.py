"""What an operator pages through and picks from, on the in-memory engine: the model of
:mod:`sqlmq.engines.sql.browse` (same rules of what a live message waits on, same filters
of the archive, same order), and the archive rows a requeue or purge picks."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ...lifecycle import State
from ...views import ArchiveQuery, MessageView
from ...waits import LiveQuery, Wait


class MemoryBrowsing:
    """``live_messages``, ``live_waits`` and ``count_archive`` of the engine contract for
    :class:`~.engine.MemoryEngine`, and the rows its requeue and purge pick."""

    _lock: threading.Lock
    _store: Any
    _now: Any

    async def live_messages(self, query: LiveQuery) -> list[MessageView]:
        with self._lock:
            now = self._now()
            rows = sorted(self._store.by_queue.get(query.queue, {}).values(),
                          key=lambda r: r.id)
            found = [live_view(r, now) for r in rows
                     if query.after is None or r.id > query.after]
        if query.waits:
            found = [v for v in found if v.waits in query.waits]
        return found[:query.limit]

    async def live_waits(self, queue: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._lock:
            now = self._now()
            for r in self._store.by_queue.get(queue, {}).values():
                w = waits_of(r, now)
                counts[w] = counts.get(w, 0) + 1
        return counts

    async def count_archive(self, query: ArchiveQuery, most: int | None = None) -> int:
        with self._lock:
            n = sum(1 for a in self._store.archive.values() if archive_matches(a, query))
        return n if most is None else min(n, most)

    def _picked(self, queue: str | None, ids: Sequence[int] | None, state: str | None,
                before: datetime | None, limit: int | None,
                matching: ArchiveQuery | None) -> list[Any]:
        """The archive rows a requeue or purge takes: those matching every filter given
        (``None``: any), at most ``limit``, lowest ids first, as the SQL engines'. The
        caller holds the lock."""
        wanted = None if ids is None else set(ids)
        found = [a for a in self._store.archive.values()
                 if (queue is None or a.queue == queue) and (wanted is None or a.id in wanted)
                 and (state is None or a.state == state)
                 and (before is None or a.archived_at < before)
                 and (matching is None or archive_matches(a, matching))]
        return found if limit is None else sorted(found, key=lambda a: a.id)[:limit]


def waits_of(r: Any, now: datetime) -> str:
    """What message row ``r`` waits on at ``now``: the rules of :mod:`sqlmq.waits`."""
    if r.cancel_requested:
        return Wait.CANCELLING.value
    if r.state == State.PROCESSING:
        return Wait.RUNNING.value
    if r.state == State.WAITING:
        return Wait.STEPS.value
    due = r.next_attempt_at or r.channel_due_at
    if due is None or due <= now:
        return Wait.READY.value
    last = (r.history or [{}])[-1]
    if isinstance(last, dict) and last.get("ended") == "deferred":
        return Wait.SIGNAL.value if r.waits_for is not None else Wait.DEFERRED.value
    return Wait.DELAYED.value


def live_view(r: Any, now: datetime) -> MessageView:
    """A row of the message table as :meth:`message_view` shows it."""
    waits = waits_of(r, now)
    return MessageView(
        r.id, r.queue, r.state, dict(r.headers), r.payload, r.priority, r.attempts_count,
        r.deliveries_count, r.created_at, None, r.next_attempt_at or r.channel_due_at,
        r.lease_expires_at, r.last_error, [dict(e) for e in r.history or ()], r.channel,
        first_attempt_at=r.first_attempt_at,
        acquired_at=r.acquired_at if r.state == State.PROCESSING else None, waits=waits,
        waits_for=r.waits_for if waits == Wait.SIGNAL else None)


def archive_matches(a: Any, q: ArchiveQuery) -> bool:
    """Whether archive row ``a`` passes ``q``'s filters (not its page)."""
    return ((q.queue is None or a.queue == q.queue)
            and (not q.states or a.state in q.states)
            and (not q.error_contains or (a.error is not None and q.error_contains in a.error))
            and (q.archived_from is None or a.archived_at >= q.archived_from)
            and (q.archived_to is None or a.archived_at < q.archived_to))


__all__ = ["MemoryBrowsing", "archive_matches", "live_view", "waits_of"]
