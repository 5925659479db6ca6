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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .records import PausedQueue, WorkerInfo
from .subscriber import check_queue

if TYPE_CHECKING:
    from .engines.contract import Engine
    from .maintenance.heartbeat import Heartbeat
    from .runtime import SubscriberRuntime
    from .wakeups import Wakeups


class Operations:
    """Pauses and the workers registry of a :class:`~sqlmq.broker.Broker`."""

    if TYPE_CHECKING:
        _engine: Engine
        _wakeups: Wakeups
        _runtimes: list[SubscriberRuntime]
        _heartbeat: Heartbeat | None

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

    # ---- live workers ------------------------------------------------------------------

    async def workers(self) -> list[WorkerInfo]:
        """The live workers: every running broker, of any process or host, on these
        tables (its host, pid, sqlmq version, subscribers and their settings, handlers in
        flight and deliveries held), from their last heartbeat. One that stopped is gone;
        one that died without stopping is left out once it has missed its heartbeats (see
        :mod:`sqlmq.maintenance.heartbeat`)."""
        return await self._engine.workers()

    @property
    def worker_id(self) -> str | None:
        """This broker's id in :meth:`workers` while it runs subscribers, else None."""
        return None if self._heartbeat is None else self._heartbeat.id

    def _describe_workers(self) -> tuple[list[dict[str, Any]], int, int]:
        """What the heartbeat reports: each subscriber's settings and counts, and the
        totals of handlers running and deliveries held."""
        found = [describe_runtime(r) for r in self._runtimes]
        return (found, sum(s["running"] for s in found), sum(s["held"] for s in found))


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
        "graceful_timeout": cfg.graceful_timeout,
        "publish_to": cfg.publish_to,
        "running": runtime.running,
        "held": runtime.buffered,
    }


__all__ = ["Operations", "describe_runtime"]
