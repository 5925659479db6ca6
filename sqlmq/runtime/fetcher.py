"""The fetcher: fills a subscriber's prefetch buffer from the database and from hand-overs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..backoff import Backoff
from ..lifecycle import Settlement
from ..middleware import NO_HOOKS, Hooks
from ..records import Delivery
from ..tasks import cancel_and_wait, loop_task
from .buffer import WorkBuffer
from .counters import RuntimeCounters
from .leases import Holdings

if TYPE_CHECKING:
    from ..engines.contract import Engine
    from ..subscriber import SubscriberConfig

#: How often a subscriber waiting for work reads the engine's commit counter (SQLite: 4 µs
#: a look, but each timer wake-up costs a VM 200-300 µs of CPU): every 5 ms while work came
#: recently, slowing to every 50 ms after a second or so without any.
COMMIT_WATCH_INTERVAL = 0.005
COMMIT_WATCH_IDLE = 0.05

#: How long after a rate-limited channel may start again the fetcher polls for it: the
#: database clock must have passed the start, whichever clock the wait was measured on.
RATE_WAKE_MARGIN = 0.001

#: The least an acquire asks for once the backlog has been caught up with (or the number of
#: workers, if more, or ``fetch_batch``, if less).
FETCH_FLOOR = 16


class FetchSize:
    """How many messages the next acquire asks for, between a floor and ``fetch_batch``.

    An acquire costs a round trip plus a per-row part; on PostgreSQL 100 rows take about
    3 ms and 500 rows 11 ms, so while the backlog is deep, small batches leave the workers
    waiting on the fetcher (defaults of 100 reached 70 % of the best drain). Big batches,
    though, hoard: a slow handler's buffer holds messages other processes could run, and
    they wait in it. So the size starts at the floor, doubles while batches come back full
    *and* the workers emptied the buffer during the round trip (the fetcher is the
    bottleneck), and halves back when a batch comes back less than a quarter full (the
    backlog is caught up). A quarter, not merely short: under a steady flow that brings
    about the floor per round trip, "short" flipped the size between 16 and 32 at every
    acquire, and each full 16 sent the next acquire at once; on SQLite at 2,000 msg/s from
    other processes that was 30-50 % more acquires than a fixed size of 100, each a turn at
    the write lock the publishers wait for (p99 latency 70-120 ms became 140-290 ms).
    The buffer is kept at two batches, within ``prefetch``: one being worked through while
    the next is fetched."""

    def __init__(self, fetch_batch: int, prefetch: int, workers: int) -> None:
        self.prefetch = prefetch
        self.ceiling = min(fetch_batch, prefetch)
        self.floor = min(self.ceiling, max(FETCH_FLOOR, workers))
        self.size = self.floor

    def limit(self, buffered: int) -> int:
        """What to acquire with ``buffered`` deliveries waiting; 0: wait for room (less than
        half a batch is free, so the acquire would be small for its round trip)."""
        free = min(self.prefetch, 2 * self.size) - buffered
        return min(self.size, free) if free >= max(1, self.size // 2) else 0

    def after_suspect(self) -> None:
        """A suspect runs alone (see :mod:`.quarantine`): the next acquire asks for one
        message, below the floor. The crashes that made it a suspect made its neighbours in
        the queue suspects too, and each runs with everything else this process holds
        handed back: a batch fetched between two suspects is a batch handed back. The size
        grows back by doubling as batches come back full; one less than a quarter full
        returns it to the floor."""
        self.size = 1

    def observe(self, got: int, limit: int, buffered: int) -> None:
        """After an acquire of ``limit`` that found ``got``, with ``buffered`` deliveries
        still waiting from earlier batches when it came back."""
        if got >= self.size and buffered == 0:
            self.size = min(self.ceiling, 2 * self.size)
        elif 4 * got < limit:
            self.size = max(self.floor, self.size // 2)


class Fetcher:
    """Acquires batches into the buffer while it and the unflushed results have room,
    polling adaptively (at once while batches come back full, backing off to
    ``max_fetch_interval`` when idle), woken by this process's publishes and, where the
    engine has one, its commit counter; and takes deliveries handed over by a publish."""

    def __init__(self, engine: Engine, cfg: SubscriberConfig, counters: RuntimeCounters,
                 holdings: Holdings, results: list[Settlement], gate: asyncio.Event,
                 room: asyncio.Event, wakeup: asyncio.Event, hooks: Hooks = NO_HOOKS) -> None:
        self.engine = engine
        self._hooks = hooks  # middleware observing acquires (fetched)
        self.cfg = cfg
        self.counters = counters
        self.held = holdings.held
        self._results = results  # the flusher's: fetching stops while max_unflushed wait
        self._gate = gate  # cleared while a suspect runs in quarantine
        self.wakeup = wakeup  # set by this process's publishes (and NOTIFY)
        #: Fetched deliveries not started yet; ``None`` tells a worker to end.
        self.buffer: WorkBuffer[Delivery | None] = WorkBuffer()
        #: Set whenever room may have appeared: a worker took from the buffer, results were
        #: written, a quarantine ended, a stop began.
        self.room = room
        self.sizing = FetchSize(cfg.fetch_batch, cfg.prefetch, cfg.workers)  # type: ignore[arg-type]
        self.caught_up = False  # the last acquire found fewer ready messages than it asked
        self._last_work = 0.0  # loop time of the last acquire that found work
        self.stopping = False
        #: Clear while an acquire is out: a quarantine waits for it, as the deliveries it
        #: brings back would otherwise land in the buffer after the hand-back, unflushed.
        self.parked = asyncio.Event()
        self.parked.set()
        self._task: asyncio.Task[None] | None = None

    def start(self, name: str) -> None:
        self._task = loop_task(self._run, f"sqlmq-fetch {name}", lambda: self.stopping)

    async def stop(self, patience: float) -> list[Delivery]:
        """Stop fetching and return the buffered deliveries, never started. An acquire in
        progress may finish (within ``patience`` seconds): cancelled mid-statement, it could commit
        on the server and strand its messages until their lease expires."""
        self.stopping = True
        self.wakeup.set()
        self.room.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=patience)
            except TimeoutError:
                await cancel_and_wait(self._task)
        unstarted = []
        while not self.buffer.empty():
            d = self.buffer.get_nowait()
            if d is not None:
                unstarted.append(d)
        return unstarted

    async def _run(self) -> None:
        cfg = self.cfg
        backoff = Backoff(f"fetch for {','.join(cfg.queues)}")
        idle = 0.0
        commits = self.engine.commit_counter()
        seen: int | None = None
        buffer, results, gate, room, size = (
            self.buffer, self._results, self._gate, self.room, self.sizing)
        while not self.stopping:
            if not gate.is_set():
                await gate.wait()
                continue
            limit = size.limit(buffer.qsize())
            if not limit or len(results) >= cfg.max_unflushed:
                room.clear()
                await room.wait()
                continue
            if commits is not None:  # read before the acquire: a commit after it is news
                seen = commits()
            try:
                batch = await self._fill(limit)
            except Exception as exc:
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            self.counters.acquired += len(batch)
            self.caught_up = len(batch) < limit
            if batch:
                self._last_work = asyncio.get_running_loop().time()
            idle, wait = _next_poll(cfg, idle, len(batch), limit,
                                    self.engine.channel_start_in(cfg.queues))
            if wait > 0:
                await self._wait_for_work(wait, commits, seen)
            else:
                await asyncio.sleep(0)
            if self.wakeup.is_set():
                # Work is on its way; it may not be visible yet (a wake-up from a caller's
                # commit can arrive just before the commit does): poll fast again.
                idle = 0.0
                self.wakeup.clear()

    async def _fill(self, limit: int) -> list[Delivery]:
        """One acquire, its deliveries buffered; ``parked`` is clear meanwhile."""
        self.parked.clear()
        try:
            sent = asyncio.get_running_loop().time()
            batch = await self.engine.acquire(self.cfg.queues, limit, self.cfg.lease)
            self.sizing.observe(len(batch), limit, self.buffer.qsize())
            if self._hooks.fetch:
                self._hooks.on_fetched(self.cfg.queues, len(batch), limit)
            for d in batch:
                self._keep(d, sent)
            return batch
        finally:
            self.parked.set()

    async def _wait_for_work(self, wait: float, commits: Callable[[], int | None] | None,
                             seen: int | None) -> None:
        """Up to ``wait`` seconds, until a wake-up from this process or, where the engine
        has a commit counter (SQLite), until it moves: some connection committed, most
        likely another process's publish. Without it, work from another process waits for
        the poll, which backs off to ``max_fetch_interval`` while the queue is idle."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        step = wait if commits is None else min(
            COMMIT_WATCH_IDLE, max(COMMIT_WATCH_INTERVAL, (now - self._last_work) / 20))
        deadline = now + wait
        while (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self.wakeup.wait(), min(left, step))
                return
            except TimeoutError:
                pass
            if commits is not None and commits() != seen:
                return

    def idle_for(self, queue: str) -> bool:
        """Whether this fetcher has nothing to fetch for ``queue``: its last acquire found
        no backlog, and it is neither stopping nor held by a quarantine. What it buffered
        is the workers' to judge (``SubscriberRuntime.takes_direct``)."""
        return (self.caught_up and not self.stopping and self._gate.is_set()
                and queue in self.cfg.queues)

    def hand_over(self, d: Delivery, sent: float | None = None) -> bool:
        """Buffer a delivery acquired on this subscriber's behalf by a publish (whose
        statement was sent at loop time ``sent``; None: now). False once stopping or while
        a suspect runs alone: the caller then gives it back."""
        if self.stopping or not self._gate.is_set():
            return False
        self._keep(d, sent)
        self.counters.acquired += 1
        return True

    def _keep(self, d: Delivery, sent: float | None) -> None:
        """Hold ``d`` (its lease is renewed from here on) and buffer it for a worker. Its
        lease cannot end before ``sent`` (when the acquire was sent) plus the lease."""
        if sent is None:
            sent = asyncio.get_running_loop().time()
        d.renewed_until = sent + self.cfg.lease
        self.held[(d.id, d.deliveries)] = d
        self.buffer.put_nowait(d)


def _next_poll(cfg: SubscriberConfig, idle: float, got: int, limit: int,
               start_in: float | None = None) -> tuple[float, float]:
    """The idle backoff and the wait before the next acquire, after one that found ``got``
    of ``limit``: none while batches come back full, 10 ms after a partial one, doubling
    towards ``max_fetch_interval`` while nothing is ready; but no later than just after
    ``start_in`` seconds, when a channel's rate lets it start again (a poll a backoff step
    late would lose that much of the rate)."""
    if got >= limit:
        return 0.0, cfg.min_fetch_interval
    if got:
        idle, wait = 0.0, max(cfg.min_fetch_interval, min(0.01, cfg.max_fetch_interval))
    else:
        idle = wait = min(cfg.max_fetch_interval, max(idle * 2, 0.005))
    if start_in is not None:
        wait = min(wait, start_in + RATE_WAKE_MARGIN)
    return idle, wait
