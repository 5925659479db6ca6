"""What operators steer and watch across processes (a mixin of
:class:`sqlmq.broker.Broker`): pausing and resuming queues, and the live workers registry.

**Pause.** ``await broker.pause("orders")`` writes a row of ``{prefix}queue_pause``; every
acquire of every process and host reads it in its own statement (the plain acquire, the
channels' acquire, the hand-over of a publish to an idle local subscriber, the Spark
source), so from the commit on nothing takes the queue's messages. Publishing goes on: the
messages wait. Deliveries taken before the pause (running handlers, prefetched ones) finish
as usual. ``await broker.resume("orders")`` deletes the row and wakes this process's
subscribers of the queue (on PostgreSQL, every listening process's too); other processes
find the messages on their next poll.

**Workers.** Each running broker heartbeats its row of ``{prefix}worker`` (see
:mod:`sqlmq.maintenance.heartbeat`); ``await broker.workers()`` lists the live ones.

**Repairs.** ``requeue``, ``purge`` and ``delete`` work on the archive in batches of one
transaction each (``batch`` rows), so 100k rows never sit in one transaction, and an
interrupt (a cancelled task, Ctrl-C in the CLI) rolls back only the batch in flight: the
count reported (``progress``) is exact. The CLI and the dashboard call these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .errors import ChannelFull, ConfigurationError
from .maintenance import ArchiveCleaner, ChannelSweeper, Heartbeat, Retention, SignalSweeper
from .records import PausedQueue, WorkerInfo
from .subscriber import check_queue
from .views import ARCHIVED_STATES, DEAD_STATES, ArchiveQuery

if TYPE_CHECKING:
    from .engines.contract import Engine
    from .runtime import SubscriberRuntime
    from .wakeups import Wakeups


class Operations:
    """Pauses and the workers registry of a :class:`~sqlmq.broker.Broker`."""

    if TYPE_CHECKING:
        _engine: Engine
        _wakeups: Wakeups
        _runtimes: list[SubscriberRuntime]
        _heartbeat: Heartbeat | None
        _cleaner: ArchiveCleaner | None
        _sweeper: ChannelSweeper | None
        _signal_sweeper: SignalSweeper | None
        heartbeat_interval: float
        retention: Retention | None

    # ---- pause and resume --------------------------------------------------------------

    async def pause(self, queue: str) -> bool:
        """Stop every process and host from taking messages of ``queue`` until
        :meth:`resume`; publishing still works (the messages wait). Any valid queue name
        may be paused, one nothing has used yet included. Returns False if it was paused
        already."""
        return await self._engine.pause(check_queue(queue))

    async def resume(self, queue: str) -> bool:
        """Let ``queue``'s messages be taken again, and wake this process's subscribers of
        it (other processes find them on their next poll; on PostgreSQL at once). Returns
        False if it was not paused."""
        resumed = await self._engine.resume(check_queue(queue))
        if resumed:
            self._wakeups.wake(queue)
        return resumed

    async def paused(self) -> list[PausedQueue]:
        """The paused queues (with when each was paused), by name."""
        return await self._engine.paused()

    # ---- repairs of the archive ------------------------------------------------------------

    async def requeue(self, *, ids: Sequence[int] | None = None, queue: str | None = None,
                      states: Sequence[str] = DEAD_STATES,
                      matching: ArchiveQuery | None = None, batch: int = 1000,
                      progress: Callable[[int], None] | None = None) -> int:
        """Put archived messages back in their queue as fresh deliveries (id, payload,
        headers, priority and history kept): those of ``ids``, or every one of ``queue``,
        or every one an archive search finds (``matching``: its filters, not its page), in
        ``states`` (default: the dead letters, FAILED and CANCELLED); every filter given
        must match. Returns how many; ``progress`` is called with the running total after
        each batch. Asking for none of ``ids``, ``queue`` and ``matching`` is an error: a
        requeue of everything is never an accident.

        A channel message comes back under its channel's limits, ``max_size`` too: a batch
        that would overfill a channel raises :class:`~sqlmq.ChannelFull` and moves nothing
        (the batches before it stay requeued; the error says how many)."""
        if ids is None and queue is None and matching is None:
            raise ConfigurationError("requeue needs ids, a queue or an archive search "
                                     "(refusing to requeue every archived message)")
        ids = None if ids is None else [int(i) for i in ids]
        queue = None if queue is None else check_queue(queue)
        moved = 0

        def moving(total: int) -> None:
            nonlocal moved
            moved = total
            if progress is not None:
                progress(total)

        try:
            return await _batches(
                [lambda n, s=s: self._engine.requeue_archived(queue=queue, ids=ids, state=s,
                                                              limit=n, matching=matching)
                 for s in _states(states, matching)], batch, moving)
        except ChannelFull as exc:
            raise ChannelFull(f"{exc} by the batch of the requeue that met it; {moved} "
                              f"requeued before it stay requeued") from None

    async def purge(self, *, older_than: timedelta | float | None = None,
                    queue: str | None = None, states: Sequence[str] = ARCHIVED_STATES,
                    ids: Sequence[int] | None = None, matching: ArchiveQuery | None = None,
                    batch: int = 1000, progress: Callable[[int], None] | None = None) -> int:
        """Delete archived messages (live ones are never touched): those archived longer
        than ``older_than`` ago (a timedelta or seconds, on the database clock), of
        ``queue``, of ``ids``, in ``states``, that an archive search finds (``matching``:
        its filters, not its page); every filter given must match. Returns how many;
        ``progress`` is called with the running total after each batch."""
        before = None
        if older_than is not None:
            try:
                age = (older_than if isinstance(older_than, timedelta)
                       else timedelta(seconds=float(older_than)))
            except (TypeError, ValueError):
                raise ConfigurationError(f"older_than must be a timedelta or seconds, got "
                                         f"{older_than!r}") from None
            if age < timedelta(0):
                raise ConfigurationError(f"older_than must be zero or more, got {older_than!r}")
            before = await self._engine.now() - age
        ids = None if ids is None else [int(i) for i in ids]
        queue = None if queue is None else check_queue(queue)
        wanted: list[str | None] = list(_states(states, matching))
        if set(wanted) == set(ARCHIVED_STATES):  # every state: one pass, not one per state
            wanted = [None]
        return await _batches(
            [lambda n, s=s: self._engine.purge_archived(queue=queue, ids=ids, state=s,
                                                        before=before, limit=n,
                                                        matching=matching)
             for s in wanted], batch, progress)

    async def delete(self, msg_id: int) -> bool:
        """Delete archived message ``msg_id``; False if the archive has no such message (a
        live one is cancelled instead: :meth:`cancel`)."""
        return await self.purge(ids=[int(msg_id)]) == 1

    # ---- live workers ------------------------------------------------------------------

    async def workers(self) -> list[WorkerInfo]:
        """The live workers: every running broker, of any process or host, on these
        tables (its host, pid, sqlmq version, subscribers and their settings, handlers in
        flight and deliveries held), from their last heartbeat. One that stopped is gone;
        one that died without stopping is left out once it has missed its heartbeats (see
        :mod:`sqlmq.maintenance.heartbeat`)."""
        return await self._engine.workers()

    def _registry_settings(self, heartbeat_interval: float,
                           retention: Retention | None) -> None:
        if isinstance(heartbeat_interval, bool) or not isinstance(
                heartbeat_interval, int | float) or not 0 < heartbeat_interval < 3600:
            raise ConfigurationError(f"heartbeat_interval must be a number of seconds above 0 "
                                     f"and under an hour, got {heartbeat_interval!r}")
        if retention is not None and not isinstance(retention, Retention):
            raise ConfigurationError(f"retention must be a Retention, got {retention!r}")
        #: Seconds between two heartbeats of the workers registry while running.
        self.heartbeat_interval = float(heartbeat_interval)
        #: How long the archive keeps what (None: for ever).
        self.retention = retention
        self._heartbeat = None
        self._cleaner = None
        self._sweeper = None
        self._signal_sweeper = None

    def _join_registry(self) -> None:
        """Start heartbeating in the live workers registry (once a subscriber runs), and
        the duties its leader does for all (the archive's retention, forgetting idle
        channels and ended messages' signals)."""
        if self._heartbeat is not None:
            return
        self._heartbeat = Heartbeat(self._engine, self.heartbeat_interval,
                                    self._describe_workers)
        self._heartbeat.start()
        if self.retention is not None:
            self._cleaner = ArchiveCleaner(self._engine, self.retention, lambda: self.leading)
            self._cleaner.start()
        self._sweeper = ChannelSweeper(self._engine, lambda: self.leading)
        self._sweeper.start()
        self._signal_sweeper = SignalSweeper(self._engine, lambda: self.leading)
        self._signal_sweeper.start()

    async def _leave_registry(self) -> None:
        if self._cleaner is not None:
            await self._cleaner.stop()
            self._cleaner = None
        if self._sweeper is not None:
            await self._sweeper.stop()
            self._sweeper = None
        if self._signal_sweeper is not None:
            await self._signal_sweeper.stop()
            self._signal_sweeper = None
        if self._heartbeat is not None:
            await self._heartbeat.stop()
            self._heartbeat = None

    @property
    def leading(self) -> bool:
        """Whether this broker leads the live workers (the one that started first), and so
        does the duties one process does for all: the archive's retention, forgetting idle
        channels and the queue-depth gauges (see :mod:`sqlmq.maintenance.heartbeat`)."""
        return self._heartbeat is not None and self._heartbeat.leading

    @property
    def worker_id(self) -> str | None:
        """This broker's id in :meth:`workers` while it runs subscribers, else None."""
        return None if self._heartbeat is None else self._heartbeat.id

    def _describe_workers(self) -> tuple[list[dict[str, Any]], int, int]:
        """What the heartbeat reports: each subscriber's settings and counts, and the
        totals of handlers running and deliveries held."""
        found = [describe_runtime(r) for r in self._runtimes]
        return (found, sum(s["running"] for s in found), sum(s["held"] for s in found))


def _states(states: Sequence[str], matching: ArchiveQuery | None = None) -> list[str]:
    """The states to move, one pass each: those of ``states`` an archive search
    ``matching`` also lets through."""
    wanted = [str(s).upper() for s in ([states] if isinstance(states, str) else states)]
    unknown = [s for s in wanted if s not in ARCHIVED_STATES]
    if unknown or not wanted:
        raise ConfigurationError(f"no archived state {', '.join(unknown) or '(none given)'} "
                                 f"(states: {', '.join(ARCHIVED_STATES)})")
    if matching is not None and matching.states:
        wanted = [s for s in wanted if s in matching.states]
    return list(dict.fromkeys(wanted))


async def _batches(steps: Sequence[Callable[[int], Awaitable[int]]], batch: int,
                   progress: Callable[[int], None] | None) -> int:
    """Run each ``step(batch)`` (one transaction moving at most ``batch`` rows) until it
    moves fewer; the running total goes to ``progress`` after every batch."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 100_000:
        raise ConfigurationError(f"batch must be 1 to 100000 rows, got {batch!r}")
    done = 0
    for step in steps:
        while True:
            n = await step(batch)
            done += n
            if progress is not None:
                progress(done)
            if n < batch:
                break
            await asyncio.sleep(0)  # a cancel lands here, between batches, on any engine
    return done


def describe_runtime(runtime: SubscriberRuntime) -> dict[str, Any]:
    """A subscriber at work as JSON: its name, queues, settings and counts."""
    cfg = runtime.cfg
    return {
        "name": runtime.name,
        "handler": runtime.adapter.name,
        "queues": list(cfg.queues),
        "groups": [list(g) for g in cfg.groups],
        "workers": cfg.workers,
        "prefetch": cfg.prefetch,
        "fetch_batch": cfg.fetch_batch,
        "lease": cfg.lease,
        "renew_leases": cfg.renew_leases,
        "min_fetch_interval": cfg.min_fetch_interval,
        "max_fetch_interval": cfg.max_fetch_interval,
        "flush_interval": cfg.flush_interval,
        "flush_batch": cfg.flush_batch,
        "max_unflushed": cfg.max_unflushed,
        "max_deliveries": cfg.max_deliveries,
        "ack_policy": str(cfg.ack_policy.value),
        "archive": str(cfg.archive.value),
        "graceful_timeout": cfg.graceful_timeout,
        "publish_to": cfg.publish_to,
        "running": runtime.running,
        "held": runtime.buffered,
    }


__all__ = ["Operations", "describe_runtime"]
