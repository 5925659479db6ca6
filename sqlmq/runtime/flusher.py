"""The flusher: writes the results of deliveries in batches, one engine call per batch."""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..backoff import Backoff
from ..dead_letters import DEAD_OUTCOMES, LOG_ONLY, DeadLetters
from ..lifecycle import Outcome, Settlement
from ..middleware import NO_HOOKS, Hooks, Settled
from ..results.keeping import awaited
from ..tasks import cancel_and_wait, loop_task
from .counters import RuntimeCounters
from .leases import Holdings, Key
from .refusals import RefusalSplitting, database_answers
from .slot_passing import SlotPassing
from .stale import log_stale

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

#: The counter of :class:`RuntimeCounters` a written result adds to, for every outcome: one
#: left to a catch-all was miscounted (expired messages were counted as given back).
_COUNTED = {
    Outcome.COMPLETE: "completed", Outcome.FAIL: "failed", Outcome.RETRY: "retried",
    Outcome.DEFER: "deferred", Outcome.CANCEL: "cancelled", Outcome.EXPIRE: "expired",
    Outcome.RELEASE: "released",
}


class Flusher(RefusalSplitting):
    """Buffers results and writes them in batches: every ``flush_interval``, or at once when
    a batch is full (or when the interval is 0); a failed batch is retried with backoff and
    never dropped, a batch the database keeps refusing is split to find the one result at
    fault, and a settle whose reply was lost is resolved with ``engine.landed``. While
    ``max_unflushed`` results wait, :meth:`record` waits too: back-pressure, not memory
    growth."""

    def __init__(self, engine: Engine, cfg: SubscriberConfig, counters: RuntimeCounters,
                 holdings: Holdings, room: Callable[[], None],
                 ready: Callable[[], None] = lambda: None, hooks: Hooks = NO_HOOKS,
                 dead_letters: DeadLetters = LOG_ONLY,
                 answered: Callable[[list[int]], None] = lambda ids: None) -> None:
        self.engine = engine
        self._dead_letters = dead_letters
        self._answered = answered  # tells this process's callers waiting for results
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
                or _urgent(self.holdings.held, settlement)):
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
            batch = self._pick()
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
                        and await database_answers(self.engine)):
                    # The database is up, yet this batch keeps failing: one result in it
                    # cannot be written. Find it rather than stop the worker for good.
                    if await self._settle_apart(batch, exc):
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

    def _pick(self) -> list[Settlement]:
        """The next batch of results to write."""
        return _one_per_message(self.results, self.cfg.flush_batch)

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
        dropped = [s for s in batch if s.id not in applied]
        if dropped:
            await log_stale(self.engine, dropped, self.cfg.archive)
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
                c.stale += 1  # logged, with why, by _settle
            else:
                counter = _COUNTED[s.outcome]
                setattr(c, counter, getattr(c, counter) + 1)
            if s.outcome in DEAD_OUTCOMES and s.id in applied:
                self._dead_letters.settled(s, d)  # logged, and the broker's hooks told
        if answered := [s.id for s in batch if s.answers and s.id in applied]:
            self._answered(answered)
        self._flushed.set()
        self._room()


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


def _urgent(held: dict[Key, Delivery], s: Settlement) -> bool:
    """Whether ``s`` is written without waiting for the interval: its delivery held a
    channel's slot (see :func:`_held_a_slot`), or a caller waits for its message's result
    (``Broker.request``), whose answer would otherwise come an interval late. Results
    written early still go in batches: those that come while a flush runs share the next."""
    d = held.get((s.id, s.deliveries))
    return d is not None and (d.holds_slot or (s.answers and awaited(d.headers)))


def _one_per_message(results: list[Settlement], limit: int,
                     together: dict[int, int] | None = None) -> list[Settlement]:
    """Up to ``limit`` results, at most one per message: the engine reports the ids that
    landed, so a stale result beside a newer one of the same message would be miscounted.
    A batch handler's results (``together``) are never split: the batch ends before one
    that would not fit, or grows to hold one that comes first."""
    batch: list[Settlement] = []
    ids: set[int] = set()
    for s in results:
        if together and id(s) in together:
            size = together[id(s)]
            if not batch:
                limit = max(limit, size)
            elif len(batch) + size > limit:
                break
        if s.id not in ids:
            batch.append(s)
            ids.add(s.id)
            if len(batch) == limit:
                break
    return batch
