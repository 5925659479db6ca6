"""The flusher: writes the results of deliveries in batches, one engine call per batch."""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..backoff import Backoff, describe
from ..dead_letters import DEAD_OUTCOMES, LOG_ONLY, DeadLetters
from ..lifecycle import Outcome, Settlement
from ..middleware import NO_HOOKS, Hooks, Settled
from ..tasks import cancel_and_wait, loop_task
from .counters import RuntimeCounters
from .leases import Holdings, Key
from .slot_passing import SlotPassing

if TYPE_CHECKING:
    from ..engines.contract import Engine
    from ..records import Delivery
    from ..subscriber import SubscriberConfig

log = logging.getLogger("sqlmq")

#: Consecutive failed flushes, with the database answering, after which the batch is split
#: to find a result it refuses.
ISOLATE_AFTER = 3
#: Times in a row a batch is written again at once when the database chooses its settle
#: as a deadlock's victim, before the flush backs off as after any other failure.
VICTIM_TRIES = 3


class Flusher:
    """Buffers results and writes them in batches: every ``flush_interval``, or at once when
    a batch is full (or when the interval is 0); a failed batch is retried with backoff and
    never dropped, a batch the database keeps refusing is split to find the one result at
    fault, and a settle whose reply was lost is resolved with ``engine.landed``. While
    ``max_unflushed`` results wait, :meth:`record` waits too: back-pressure, not memory
    growth."""

    def __init__(self, engine: Engine, cfg: SubscriberConfig, counters: RuntimeCounters,
                 holdings: Holdings, room: Callable[[], None],
                 ready: Callable[[], None] = lambda: None, hooks: Hooks = NO_HOOKS,
                 dead_letters: DeadLetters = LOG_ONLY) -> None:
        self.engine = engine
        self._dead_letters = dead_letters
        self._hooks = hooks  # middleware observing flushes and results (flushed, settled)
        self.cfg = cfg
        self.counters = counters
        self.holdings = holdings
        #: Results waiting to be written, oldest first. Only ever changed in place: the lease
        #: keeper and the fetcher read this very list.
        self.results: list[Settlement] = []
        #: Deliveries whose result was in a settle that failed: it may have committed all
        #: the same (the reply lost with the connection), see _settle.
        self._in_doubt: set[Key] = set()
        self._room = room  # tells the fetcher that results were written
        #: Tells the fetcher that a written result made a message ready at once (a defer or
        #: a retry without delay, or any result of a delivery that held a channel's slot):
        #: its next acquire should not wait for the idle poll, or a handler deferring itself
        #: in a loop runs once per poll interval, and a channel limited to N runs N per
        #: poll interval.
        self._ready = ready
        #: Set by the runtime: settles that pass freed channel slots straight on.
        self.passing: SlotPassing | None = None
        self._flushed = asyncio.Event()  # set when results were written (workers wait on it)
        self._now = asyncio.Event()  # a batch is ready: flush before the interval ends
        self._lock = asyncio.Lock()  # one flush at a time; stop() never cuts one in half
        self._backoff = Backoff(f"flush for {','.join(cfg.queues)}")
        self.stopping = False
        self._task: asyncio.Task[None] | None = None

    @property
    def full(self) -> bool:
        return len(self.results) >= self.cfg.max_unflushed

    def start(self, name: str) -> None:
        self._task = loop_task(self._run, f"sqlmq-flush {name}", lambda: self.stopping)

    async def record(self, settlement: Settlement) -> None:
        """Queue a worker's result, waiting while ``max_unflushed`` results wait already."""
        while len(self.results) >= self.cfg.max_unflushed:
            self._flushed.clear()
            await self._flushed.wait()
        self.results.append(settlement)
        if (len(self.results) >= self.cfg.flush_batch or not self.cfg.flush_interval
                or _held_a_slot(self.holdings.held, settlement)):
            self._now.set()

    def add(self, settlement: Settlement, *, soon: bool = False) -> None:
        """Queue a result without waiting (hand-backs, stop); ``soon``: flush it now."""
        self.results.append(settlement)
        if soon or not self.cfg.flush_interval:
            self._now.set()

    def settling(self, key: Key) -> bool:
        """Whether a result for delivery ``key`` waits to be written."""
        return any((s.id, s.deliveries) == key for s in self.results)

    async def _run(self) -> None:
        interval = self.cfg.flush_interval
        while True:
            if not interval:  # at once: each result sets _now (a timeout of 0 would spin)
                if not self.results:  # what a failed flush left is retried after its backoff
                    await self._now.wait()
            else:
                try:
                    await asyncio.wait_for(self._now.wait(), interval)
                except TimeoutError:
                    pass
            self._now.clear()
            await self.flush_once()

    async def flush_all(self) -> None:
        """Flush until nothing waits (or the subscriber stops)."""
        while self.results and not self.stopping:
            await self.flush_once()

    async def flush_once(self) -> None:
        async with self._lock:
            await self._flush_locked()

    async def stop(self, patience: float) -> None:
        """End the flush loop (never in the middle of a statement), then write what waits,
        for up to ``patience`` seconds."""
        async with self._lock:
            await cancel_and_wait(self._task)
        deadline = asyncio.get_running_loop().time() + patience
        while self.results and asyncio.get_running_loop().time() < deadline:
            await self.flush_once()

    async def _flush_locked(self) -> None:
        victim = 0
        while self.results:
            batch = _one_per_message(self.results, self.cfg.flush_batch)
            try:
                applied, started = await self._settle(batch, passing=not self.stopping)
            except Exception as exc:
                if victim + 1 < VICTIM_TRIES and self.engine.deadlock_victim(exc):
                    # Rolled back whole: nothing was written, and waiting gains nothing.
                    victim += 1
                    log.info("a flush of %d results was a deadlock's victim; writing it "
                             "again (%d of %d)", len(batch), victim + 1, VICTIM_TRIES)
                    continue
                if (self._backoff.failures + 1 >= ISOLATE_AFTER
                        and await _answers(self.engine)):
                    # The database is up, yet this batch keeps failing: one result in it
                    # cannot be written. Find it rather than stop the worker for good.
                    if await self._settle_apart(batch):
                        self._backoff.succeeded()
                        continue
                await self._backoff.failed(exc)
                return
            self._backoff.succeeded()
            victim = 0
            self._applied(batch, applied, passed=len(started))
            if started:
                assert self.passing is not None
                self.passing.start(started)

    async def _settle(self, batch: list[Settlement],
                      passing: bool = False) -> tuple[set[int], list[Delivery]]:
        """Settle ``batch``; the ids whose result is written, now or by an earlier try, and
        (``passing``) the deliveries started in the slots it freed.

        A settle that fails may still have committed: the server ran the COMMIT and the
        connection died before its reply arrived (a restart, a killed connection). Retried,
        those rows are no longer PROCESSING and the engine leaves them out, exactly as if a
        newer delivery had taken them; counted stale, the messages would be archived but
        never counted completed. So every result of a failed batch is in doubt until a
        settle succeeds, and the ones it leaves out are then looked up (``landed``)."""
        observed = self._hooks.flush
        started = time.perf_counter() if observed else 0.0
        try:
            if passing and self.passing is not None:
                applied, onward = await self.passing.settle(self.engine, batch)
            else:
                applied, onward = await self.engine.settle(batch), []
            doubtful = [s for s in batch
                        if s.id not in applied and (s.id, s.deliveries) in self._in_doubt]
            if doubtful:
                applied = applied | await self.engine.landed(doubtful)
        except BaseException:
            self._in_doubt.update((s.id, s.deliveries) for s in batch)
            raise
        if observed:
            self._hooks.on_flushed(self.cfg.queues, len(batch), self.cfg.flush_batch,
                                   time.perf_counter() - started)
        return applied, onward

    def _applied(self, batch: list[Settlement], applied: set[int], passed: int = 0) -> None:
        results = self.results
        k = len(batch)
        if len(results) >= k and all(map(operator.is_, batch, results)):
            del results[:k]  # the usual case: the batch was the oldest results
        else:
            flushed = {id(s) for s in batch}
            results[:] = [s for s in results if id(s) not in flushed]
        c = self.counters
        held, lost, in_doubt = self.holdings.held, self.holdings.lost, self._in_doubt
        # The fetcher is told at once of what it may start now: a message made ready again,
        # or a slot freed and not passed on.
        freed = sum(1 for s in batch if s.id in applied and _held_a_slot(held, s))
        if freed > passed or any(s.id in applied and _ready_again(s) for s in batch):
            self._ready()
        observed = self._hooks.settle
        for s in batch:
            d = held.pop((s.id, s.deliveries), None)
            if observed:
                self._hooks.on_settled(Settled(s, d, stale=s.id not in applied))
            lost.discard((s.id, s.deliveries))
            in_doubt.discard((s.id, s.deliveries))
            if s.id not in applied:
                c.stale += 1
                log.warning("dropped a stale result for message %d (delivery %d): its lease "
                            "expired and it was delivered again", s.id, s.deliveries)
            elif s.outcome is Outcome.COMPLETE:
                c.completed += 1
            elif s.outcome is Outcome.FAIL:
                c.failed += 1
            elif s.outcome is Outcome.RETRY:
                c.retried += 1
            elif s.outcome is Outcome.DEFER:
                c.deferred += 1
            elif s.outcome is Outcome.CANCEL:
                c.cancelled += 1
            else:
                c.released += 1
            if s.outcome in DEAD_OUTCOMES and s.id in applied:
                self._dead_letters.settled(s, d)  # logged, and the broker's hooks told
        self._flushed.set()
        self._room()

    async def _settle_apart(self, batch: list[Settlement]) -> bool:
        """Find the one result the database refuses: settle the halves and follow the half
        that fails. When both halves fail, the database is refusing everything (a missing
        table, a permission) rather than one result: nothing is given up then, and the flush
        backs off as usual. True when some results were written (or one given up)."""
        progress = False
        while len(batch) > 1:
            mid = len(batch) // 2
            failed = []
            for half in (batch[:mid], batch[mid:]):
                try:
                    applied, _ = await self._settle(half)
                except Exception:
                    failed.append(half)
                else:
                    self._applied(half, applied)
                    progress = True
            if len(failed) != 1:
                return progress
            batch = failed[0]
        if not progress:  # a lone result: nothing shows it is the one at fault
            return False
        try:  # it failed beside one that did not; a lock timeout deserves a second try
            applied, _ = await self._settle(batch)
        except Exception as exc:
            if await _answers(self.engine):
                self._give_up(batch[0], exc)
        else:
            self._applied(batch, applied)
        return True

    def _give_up(self, s: Settlement, exc: BaseException) -> None:
        """Drop a result the database will not take. The message itself stays in the queue,
        PROCESSING under a lease we stop renewing, so it is delivered again once the lease
        expires: nothing is lost, and the worker goes on with everything else."""
        self.results[:] = [r for r in self.results if r is not s]
        self.holdings.held.pop((s.id, s.deliveries), None)
        self._in_doubt.discard((s.id, s.deliveries))
        self.counters.unwritable += 1
        log.error("the result of message %d (delivery %d, %s) cannot be written: %s; it will be "
                  "delivered again when its lease expires", s.id, s.deliveries,
                  s.outcome.name.lower(), describe(exc))
        self._flushed.set()
        self._room()


async def _answers(engine: Engine) -> bool:
    """Whether the database answers at all (a batch failing while it does holds a result it
    refuses)."""
    try:
        await engine.now()
    except Exception:
        return False
    return True


def _ready_again(s: Settlement) -> bool:
    """Whether ``s``, written, leaves its message ready to be delivered at once."""
    return (s.outcome in (Outcome.RETRY, Outcome.DEFER)
            and s.delay <= 0 and s.at is None)


def _held_a_slot(held: dict[Key, Delivery], s: Settlement) -> bool:
    """Whether ``s`` is the result of a delivery holding a channel's slot: written, it
    lets another of the channel start, so it is written without waiting for the interval
    and the fetcher is told at once."""
    d = held.get((s.id, s.deliveries))
    return d is not None and d.holds_slot


def _one_per_message(results: list[Settlement], limit: int) -> list[Settlement]:
    """Up to ``limit`` results, at most one per message: the engine reports the ids that
    landed, so a stale result beside a newer one of the same message would be miscounted."""
    batch: list[Settlement] = []
    ids: set[int] = set()
    for s in results:
        if s.id not in ids:
            batch.append(s)
            ids.add(s.id)
            if len(batch) == limit:
                break
    return batch
