"""The deliveries a subscriber holds, and the lease keeper that keeps their leases."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..backoff import Backoff, describe
from ..lifecycle import Settlement
from ..middleware import NO_HOOKS, Hooks
from ..records import Delivery
from ..tasks import cancel_and_wait, loop_task
from .counters import RuntimeCounters
from .lease_deadlines import Key, LeaseDeadlines

if TYPE_CHECKING:
    from ..engines.contract import Engine
    from ..subscriber import SubscriberConfig
    from ..workflows.records import Dependency, Signal

log = logging.getLogger("sqlmq")

#: Leases extended by one statement.
EXTEND_CHUNK = 1000


class Holdings:
    """Every delivery this subscriber holds (buffered, running or waiting to be flushed) by
    its key, and the keys whose lease was found lost. The fetcher adds, the flusher removes
    once a result is written or given up, the lease keeper reads and marks losses, a worker
    skips a lost one. Plain containers, shared.

    ``deadlines`` bound the running handlers by their lease: each ends at its delivery's
    ``renewed_until``, which the lease keeper pushes on with every extension. A handler
    whose lease could not be extended in time (the database slow or out of reach, the
    process starved) is cancelled there, before the lease can expire in the database and
    another process start the message again (:func:`within_lease`)."""

    __slots__ = ("deadlines", "held", "lost", "renewing")

    def __init__(self) -> None:
        self.held: dict[Key, Delivery] = {}
        self.lost: set[Key] = set()
        self.deadlines = LeaseDeadlines()
        #: When the lease keeper's renewal under way started (loop time; None: none is),
        #: for the warning of a cancelled handler: a slow database or a starved process.
        self.renewing: float | None = None

    def renewed(self, d: Delivery, until: float) -> None:
        """``d``'s lease was extended by a statement sent at loop time ``until`` less its
        seconds: its handler may run until then (the last extension is the one that counts,
        a shorter one included: the database keeps only the last)."""
        d.renewed_until = until
        self.deadlines.reschedule((d.id, d.deliveries), until)

    def ran_out_while_running(self, d: Delivery, counters: RuntimeCounters, handler: str,
                              lease: float) -> None:
        """The handler of ``d`` was cancelled when its lease could not be renewed in time:
        nothing is written (the result would be stale, or would race the lease's end) and
        the lease is no longer renewed, so the message is delivered again once it ends, as
        after a crash. Counted as a lost lease (once, if the keeper found it lost too)."""
        key = (d.id, d.deliveries)
        if key not in self.lost:
            counters.lost_leases += 1
        self.lost.discard(key)
        self.held.pop(key, None)
        if self.renewing is None:
            why = "no renewal was under way: the process was starved, or renewals failed"
        else:
            why = (f"a renewal sent {asyncio.get_running_loop().time() - self.renewing:.2f}s "
                   f"ago has not come back")
        log.warning("handler %s of message %d (delivery %d) cancelled: its lease could not be "
                    "renewed in time (lease %.1fs; %s); it will be delivered again once the "
                    "lease ends", handler, d.id, d.deliveries, lease, why)

    def ran_out(self, key: Key) -> None:
        """``key``'s lease is lost: a handler still running it is cancelled now."""
        self.deadlines.reschedule(key, asyncio.get_running_loop().time())

    def flag_cancel(self, ids: set[int]) -> None:
        """Mark the held deliveries of ``ids`` as asked to cancel (``msg.cancel_requested``;
        :func:`~sqlmq.lifecycle.decide` then archives any result but a success CANCELLED)."""
        for (msg_id, _), d in list(self.held.items()):
            if msg_id in ids:
                d.cancel_requested = True


class LeaseKeeper:
    """Keeps the leases of the deliveries held: every ``lease / 3`` seconds it extends them
    all, a statement per thousand, and reads which of them another process asked to cancel;
    and it extends one when a handler asks (:class:`sqlmq.message.LeaseHandle`)."""

    def __init__(self, engine: Engine, cfg: SubscriberConfig, counters: RuntimeCounters,
                 holdings: Holdings, settling: list[Settlement],
                 hooks: Hooks = NO_HOOKS) -> None:
        self.engine = engine
        self._hooks = hooks  # middleware observing extensions (leases_extended)
        self.cfg = cfg
        self.counters = counters
        self.holdings = holdings
        #: Results waiting to be flushed (the flusher's list): a delivery among them that
        #: the engine no longer extends was settled meanwhile, not lost.
        self._settling = settling
        self.stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self, name: str) -> None:
        if self.cfg.renew_leases:
            self._task = loop_task(self._run, f"sqlmq-lease {name}", lambda: self.stopping)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        """Renew every third of a lease, counted from the start of the last renewal, not
        its end: counted from the end, a slow renewal (SQLite's writer busy on a loaded
        machine) pushed the next one later by its own length, and two of them left a
        handler's lease to run out while its process lived."""
        backoff = Backoff(f"lease renewal for {','.join(self.cfg.queues)}")
        loop = asyncio.get_running_loop()
        every = self.cfg.lease / 3
        due = loop.time() + every
        while True:
            wait = due - loop.time()
            await asyncio.sleep(max(0.0, wait))
            if wait > 0:  # else the last renewal itself ran past this one's time
                self._woke(loop.time() - due, every)
            due = loop.time() + every
            try:
                await self.renew()
            except Exception as exc:
                await backoff.failed(exc)
            else:
                backoff.succeeded()

    def _woke(self, late: float, every: float) -> None:
        """Say when the renewal's wait ended more than a third of a lease late: the event
        loop was blocked (a handler's synchronous work) or the process starved of CPU, and
        any handler whose lease ran out meanwhile is cancelled, its message delivered
        again. Its warning alone did not say why no renewal had come. (A renewal that
        itself outlasts the interval, a slow database, is not this.)"""
        if late > every:
            self.counters.late_renewals += 1
            log.warning("lease renewal for %s woke %.2fs late (due every %.2fs): the event "
                        "loop was blocked or the process starved of CPU", ",".join(
                            self.cfg.queues), late, every)

    async def renew(self) -> None:
        """Extend every held lease; a lease the engine did not extend is lost. While it runs
        (its extensions and its reads of cancel requests), ``holdings.renewing`` says since
        when, for the warning of a handler cancelled meanwhile."""
        self.holdings.renewing = asyncio.get_running_loop().time()
        try:
            await self._renew()
        finally:
            self.holdings.renewing = None

    async def _renew(self) -> None:
        held, lost = self.holdings.held, self.holdings.lost
        keys = list(held)
        loop = asyncio.get_running_loop()
        for start in range(0, len(keys), EXTEND_CHUNK):
            chunk = keys[start : start + EXTEND_CHUNK]
            sent = loop.time()
            kept = await self.engine.extend(chunk, self.cfg.lease)
            # A delivery whose result is already being flushed may have been archived in the
            # meantime: missing from ``kept`` then means settled, not lost.
            finished = {(s.id, s.deliveries) for s in self._settling}
            lost_now = 0
            for key in chunk:
                d = held.get(key)
                if d is None:
                    continue
                if key[0] in kept:
                    self.holdings.renewed(d, sent + self.cfg.lease)
                elif key not in finished:
                    lost.add(key)
                    self.holdings.ran_out(key)
                    lost_now += 1
                    self.counters.lost_leases += 1
                    log.warning("lease of message %d (delivery %d) was lost before it could be "
                                "renewed", key[0], key[1])
            if self._hooks.lease:
                self._hooks.on_leases(self.cfg.queues, len(kept), lost_now)
            flagged = await self.engine.cancel_requests([i for i, _ in chunk])
            if flagged:
                self.holdings.flag_cancel(flagged)

    async def dependencies(self, d: Delivery) -> list[Dependency]:
        """The dependencies of workflow step ``d`` as they ended (``Message.dependencies``)."""
        return await self.engine.dependencies(d.id)

    async def received_signal(self, d: Delivery) -> Signal | None:
        """The signal ``d``'s message waited for (``Message.signal``)."""
        return await self.engine.received_signal(d.id, d.deliveries)

    async def extend(self, d: Delivery, seconds: float) -> bool:
        """Push ``d``'s lease to now + ``seconds`` (``Message.extend``); False if lost."""
        sent = asyncio.get_running_loop().time()
        try:
            kept = await self.engine.extend([(d.id, d.deliveries)], seconds)
        except Exception as exc:
            log.warning("extending the lease of message %d failed: %s", d.id, describe(exc))
            raise
        if self._hooks.lease:
            self._hooks.on_leases(self.cfg.queues, len(kept), 1 - len(kept))
        if d.id in kept:
            self.holdings.renewed(d, sent + seconds)
        return d.id in kept
