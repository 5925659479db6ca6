"""The runtime's services one at a time, on a scripted engine (no database): the flusher,
the lease keeper, the quarantine, the fetcher and the worker pool. The behaviour tests run
them composed, on the real databases."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from sqlmq.errors import ConfigurationError
from sqlmq.lifecycle import Archive, Outcome, Settlement
from sqlmq.records import Delivery, Whereabouts
from sqlmq.runtime import SubscriberRuntime
from sqlmq.runtime.buffer import WorkBuffer
from sqlmq.runtime.counters import RuntimeCounters
from sqlmq.runtime.fetcher import FETCH_FLOOR, Fetcher, FetchSize, _next_poll
from sqlmq.runtime.flusher import ISOLATE_AFTER, Flusher
from sqlmq.runtime.leases import Holdings, LeaseKeeper
from sqlmq.runtime.quarantine import QUARANTINE_AFTER, Quarantine, is_suspect
from sqlmq.runtime.stale import stale_reason
from sqlmq.subscriber import HandlerAdapter, Subscriber, SubscriberConfig

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def delivery(i: int, deliveries: int = 1, history: list[dict[str, Any]] | None = None,
             ) -> Delivery:
    return Delivery(i, "q", {}, b"{}", 0, deliveries, NOW, NOW, NOW, NOW, None,
                    history or [])


class ScriptedEngine:
    """Just the contract methods the runtime calls, scripted."""

    def __init__(self) -> None:
        self.ready: list[Delivery] = []
        self.settled: list[list[Settlement]] = []
        self.written: set[int] = set()  # ids whose result is in the database
        self.fail_settles = 0  # the next n settles fail
        self.commit_then_fail = 0  # the next n settles commit, then lose their reply
        self.refused: set[int] = set()  # ids whose result the database will not take
        self.stale: set[int] = set()  # ids whose delivery is no longer ours
        self.down = False
        self.extends: list[list[tuple[int, int]]] = []
        self.acquires: list[int] = []
        self.hold: asyncio.Event | None = None
        self.cancelled: set[int] = set()  # ids another process asked to cancel

    async def acquire(self, queues: Sequence[str], limit: int, lease: float) -> list[Delivery]:
        self.acquires.append(limit)
        if self.hold is not None:  # an acquire in flight until the test lets it land
            await self.hold.wait()
        batch, self.ready = self.ready[:limit], self.ready[limit:]
        return batch

    def channel_start_in(self, queues: Sequence[str]) -> float | None:
        return None

    async def settle(self, batch: Sequence[Settlement]) -> set[int]:
        if self.fail_settles:
            self.fail_settles -= 1
            raise ConnectionError("connection lost")
        if self.refused & {s.id for s in batch}:
            raise ValueError("a trigger refuses it")
        self.settled.append(list(batch))
        applied = {s.id for s in batch if s.id not in self.stale and s.id not in self.written}
        self.written |= applied
        if self.commit_then_fail:
            self.commit_then_fail -= 1
            raise ConnectionError("connection lost after COMMIT")
        return applied

    async def landed(self, batch: Sequence[Settlement]) -> set[int]:
        return {s.id for s in batch if s.id in self.written}

    async def whereabouts(self, ids: Sequence[int]) -> dict[int, Whereabouts]:
        return {}  # every message gone, as after its consumer group was deleted

    def deadlock_victim(self, exc: BaseException) -> bool:
        return False

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        self.extends.append(list(leases))
        return {i for i, _ in leases if i not in self.stale}

    async def cancel_requests(self, ids: Sequence[int]) -> set[int]:
        return set(ids) & self.cancelled

    def commit_counter(self) -> Callable[[], int | None] | None:
        return None

    async def now(self) -> datetime:
        if self.down:
            raise ConnectionError("database down")
        return NOW


def config(**kw: Any) -> SubscriberConfig:
    kw.setdefault("flush_interval", 0.01)
    kw.setdefault("max_fetch_interval", 0.02)
    return SubscriberConfig(queues=("q",), **kw)


def flusher(engine: ScriptedEngine, **kw: Any) -> tuple[Flusher, Holdings, RuntimeCounters]:
    holdings, counters = Holdings(), RuntimeCounters()
    return Flusher(engine, config(**kw), counters, holdings, lambda: None), holdings, counters


def open_event() -> asyncio.Event:
    """An event already set: an open gate, idle workers, a parked fetcher."""
    event = asyncio.Event()
    event.set()
    return event


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


# ---- flusher -------------------------------------------------------------------------------

async def test_flusher_writes_batches_and_counts_each_outcome() -> None:
    engine = ScriptedEngine()
    f, holdings, counters = flusher(engine, flush_batch=2)
    outcomes = [Outcome.COMPLETE, Outcome.FAIL, Outcome.RETRY, Outcome.RELEASE]
    for i, outcome in enumerate(outcomes, 1):
        holdings.held[(i, 1)] = delivery(i)
        holdings.lost.add((i, 1))
        await f.record(Settlement(i, 1, outcome))
    await f.flush_once()
    assert [[s.id for s in b] for b in engine.settled] == [[1, 2], [3, 4]]
    assert (counters.completed, counters.failed, counters.retried, counters.released) == (1,) * 4
    assert f.results == [] and holdings.held == {} and holdings.lost == set()


async def test_flusher_sends_one_result_per_message_per_batch_and_counts_stale_ones() -> None:
    engine = ScriptedEngine()
    engine.stale = {1}
    f, _, counters = flusher(engine)
    for s in (Settlement(1, 1, Outcome.COMPLETE), Settlement(1, 2, Outcome.COMPLETE),
              Settlement(2, 1, Outcome.COMPLETE)):
        f.add(s)
    await f.flush_once()
    assert [[(s.id, s.deliveries) for s in b] for b in engine.settled] == [
        [(1, 1), (2, 1)], [(1, 2)]]
    assert (counters.stale, counters.completed) == (2, 1)


def test_a_stale_results_reason_is_read_from_where_its_message_is_now() -> None:
    s = Settlement(1, 2, Outcome.COMPLETE)
    assert stale_reason(s, None, Archive.ALL) == (
        "the message was deleted while it ran (its consumer group was deleted, or it was "
        "removed by hand)")
    assert stale_reason(s, None, Archive.FAILED).endswith(
        ", or a later delivery ended it and archive='failed' did not keep it")
    assert stale_reason(s, Whereabouts("PROCESSING", 3), Archive.ALL) == (
        "its lease expired and it was delivered again (delivery 3)")
    assert stale_reason(s, Whereabouts("FAILED", 4), Archive.ALL) == (
        "its lease expired and it was delivered again, which ended it FAILED")
    assert stale_reason(s, Whereabouts("CANCELLED", 2), Archive.ALL) == (
        "its lease expired and it was archived CANCELLED before it ran again")
    assert stale_reason(s, Whereabouts("PENDING", 2), Archive.ALL) == (
        "its lease expired and it went back to the queue (PENDING)")


async def test_a_stale_result_whose_message_cannot_be_looked_up_is_still_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    engine = ScriptedEngine()
    engine.stale = {1}
    engine.whereabouts = None  # type: ignore[assignment]  # the look-up raises TypeError
    f, _, counters = flusher(engine)
    f.add(Settlement(1, 1, Outcome.COMPLETE))
    await f.flush_once()
    assert f.results == [] and counters.stale == 1
    (warning,) = [r.getMessage() for r in caplog.records if "stale result" in r.getMessage()]
    assert warning.startswith("dropped a stale result for message 1 (delivery 1): why is "
                              "unknown, its message could not be looked up")


async def test_flusher_keeps_results_of_a_failed_flush_and_counts_a_lost_reply_as_written(
) -> None:
    engine = ScriptedEngine()
    engine.commit_then_fail = 1
    f, _, counters = flusher(engine)
    f.add(Settlement(1, 1, Outcome.COMPLETE))
    await f.flush_once()  # committed, reply lost: kept, in doubt
    assert len(f.results) == 1 and counters.completed == 0
    await f.flush_once()  # the retry leaves it out; landed() says it is ours
    assert f.results == [] and (counters.completed, counters.stale) == (1, 0)


async def test_flusher_gives_up_the_one_result_the_database_refuses() -> None:
    engine = ScriptedEngine()
    engine.refused = {3}
    f, holdings, counters = flusher(engine)
    for i in range(1, 6):
        holdings.held[(i, 1)] = delivery(i)
        f.add(Settlement(i, 1, Outcome.COMPLETE))
    for _ in range(ISOLATE_AFTER):
        await f.flush_once()
    assert f.results == [] and (3, 1) not in holdings.held
    assert (counters.completed, counters.unwritable) == (4, 1)
    assert engine.written == {1, 2, 4, 5}


async def test_flusher_gives_nothing_up_while_the_database_does_not_answer() -> None:
    engine = ScriptedEngine()
    engine.refused, engine.down = {3}, True
    f, _, counters = flusher(engine)
    for i in range(1, 4):
        f.add(Settlement(i, 1, Outcome.COMPLETE))
    for _ in range(ISOLATE_AFTER + 1):
        await f.flush_once()
    assert len(f.results) == 3 and counters.unwritable == 0


async def test_flusher_record_waits_while_max_unflushed_results_wait() -> None:
    engine = ScriptedEngine()
    f, _, _ = flusher(engine, max_unflushed=2, flush_interval=3600)
    await f.record(Settlement(1, 1, Outcome.COMPLETE))
    await f.record(Settlement(2, 1, Outcome.COMPLETE))
    assert f.full
    third = asyncio.create_task(f.record(Settlement(3, 1, Outcome.COMPLETE)))
    await asyncio.sleep(0.02)
    assert not third.done() and len(f.results) == 2
    await f.flush_once()
    await asyncio.wait_for(third, 1)
    assert [s.id for s in f.results] == [3]


async def test_flusher_stop_ends_its_loop_and_writes_what_waits() -> None:
    engine = ScriptedEngine()
    f, _, counters = flusher(engine, flush_interval=3600)
    f.start("test")
    f.add(Settlement(1, 1, Outcome.COMPLETE))
    await f.stop(5)
    assert f.results == [] and counters.completed == 1


async def test_flusher_with_no_interval_writes_each_result_at_once_without_spinning() -> None:
    engine = ScriptedEngine()
    f, _, counters = flusher(engine, flush_interval=0)
    flushes = 0
    original = f.flush_once

    async def counted() -> None:
        nonlocal flushes
        flushes += 1
        await original()

    f.flush_once = counted  # type: ignore[method-assign]
    f.start("test")
    await asyncio.sleep(0.05)
    assert flushes == 0  # a timeout of 0 in wait_for made this loop run thousands of times
    await f.record(Settlement(1, 1, Outcome.COMPLETE))
    await until(lambda: counters.completed == 1)
    assert flushes == 1
    engine.fail_settles = 1  # a failed flush is tried again after its backoff, unprompted
    await f.record(Settlement(2, 1, Outcome.COMPLETE))
    await until(lambda: counters.completed == 2)
    assert flushes == 3
    await f.stop(5)


async def test_flusher_tells_the_fetcher_when_a_written_result_makes_a_message_ready() -> None:
    engine = ScriptedEngine()
    engine.stale = {4}
    ready: list[int] = []
    f = Flusher(engine, config(), RuntimeCounters(), Holdings(), lambda: None,
                ready=lambda: ready.append(1))
    for batch in ([Settlement(1, 1, Outcome.COMPLETE), Settlement(2, 1, Outcome.RETRY, delay=5)],
                  [Settlement(3, 1, Outcome.DEFER, at=NOW)],
                  [Settlement(4, 1, Outcome.DEFER)],  # stale: nothing was made ready
                  [Settlement(5, 1, Outcome.DEFER, attempted=False)],
                  [Settlement(6, 1, Outcome.RETRY)]):
        for s in batch:
            f.add(s)
        await f.flush_once()
        ready.append(0)
    assert ready == [0, 0, 0, 1, 0, 1, 0]


def test_a_negative_flush_interval_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="flush_interval"):
        config(flush_interval=-1)


# ---- lease keeper --------------------------------------------------------------------------

async def test_lease_keeper_renews_every_held_lease_and_marks_lost_ones() -> None:
    engine = ScriptedEngine()
    engine.stale = {2, 3}
    engine.cancelled = {1, 7}
    holdings, counters, settling = Holdings(), RuntimeCounters(), [Settlement(3, 1,
                                                                              Outcome.COMPLETE)]
    keeper = LeaseKeeper(engine, config(), counters, holdings, settling)
    for i in (1, 2, 3):
        holdings.held[(i, 1)] = delivery(i)
    await keeper.renew()
    assert engine.extends == [[(1, 1), (2, 1), (3, 1)]]
    # 3 is missing because its result was written meanwhile: settled, not lost
    assert holdings.lost == {(2, 1)} and counters.lost_leases == 1
    # and the cancellation another process asked for reaches the held delivery
    assert [d.cancel_requested for d in holdings.held.values()] == [True, False, False]
    assert await keeper.extend(delivery(1), 60) is True
    assert await keeper.extend(delivery(2), 60) is False


# ---- quarantine ----------------------------------------------------------------------------

def test_a_suspect_is_a_message_whose_last_deliveries_all_expired() -> None:
    expired = {"ended": "lease_expired"}
    assert QUARANTINE_AFTER == 2
    assert is_suspect([{"ended": "error"}, expired, expired])
    assert not is_suspect([expired])
    assert not is_suspect([expired, {"ended": "error"}])


async def test_quarantine_hands_back_the_buffer_waits_for_handlers_and_runs_alone() -> None:
    engine = ScriptedEngine()
    f, _, _ = flusher(engine, flush_interval=3600)
    buffer: WorkBuffer[Delivery | None] = WorkBuffer()
    for item in (delivery(2), None, delivery(3)):
        buffer.put_nowait(item)
    gate, idle, rooms = open_event(), asyncio.Event(), []
    q = Quarantine(config(), buffer, f, gate, lambda: rooms.append(1), open_event())
    seen: list[str] = []

    async def run(d: Delivery) -> Settlement:
        seen.append(f"run {d.id}, gate {'open' if gate.is_set() else 'closed'}, "
                    f"written {sorted(engine.written)}")
        return Settlement(d.id, d.deliveries, Outcome.COMPLETE)

    f.add(Settlement(9, 1, Outcome.COMPLETE))  # a neighbour's finished result
    task = asyncio.create_task(q.run_alone(delivery(1), run, idle))
    await asyncio.sleep(0.02)
    assert not task.done() and not gate.is_set()  # waits for the running handlers
    assert [buffer.get_nowait() for _ in range(buffer.qsize())] == [None]  # markers stay
    idle.set()
    await asyncio.wait_for(task, 5)
    assert seen == ["run 1, gate closed, written [2, 3, 9]"]
    refunds = [s for b in engine.settled for s in b if s.id in (2, 3)]
    assert all(s.outcome is Outcome.RELEASE and s.refund for s in refunds)
    assert engine.written == {1, 2, 3, 9} and gate.is_set() and rooms == [1]


async def test_quarantine_waits_for_an_acquire_in_flight_and_hands_its_batch_back_first() -> None:
    """A batch that lands after the gate closed is handed back and written before the suspect
    runs: a crash then charges those messages nothing (it did, 4 deliveries for 2 expiries)."""
    engine = ScriptedEngine()
    engine.hold = asyncio.Event()
    engine.ready = [delivery(5), delivery(6)]
    f, _, _ = flusher(engine, flush_interval=3600)
    gate, idle = open_event(), open_event()
    fetch = fetcher(engine, gate=gate)
    q = Quarantine(config(), fetch.buffer, f, gate, lambda: None, fetch.parked)
    seen: list[str] = []

    async def run(d: Delivery) -> Settlement:
        seen.append(f"run {d.id}, written {sorted(engine.written)}")
        return Settlement(d.id, d.deliveries, Outcome.COMPLETE)

    fetch.start("test")
    try:
        await until(lambda: engine.acquires != [])
        task = asyncio.create_task(q.run_alone(delivery(1), run, idle))
        await asyncio.sleep(0.02)
        assert seen == [] and not gate.is_set()  # the acquire is still out
        assert not fetch.hand_over(delivery(7))  # a publish's hand-over goes back meanwhile
        engine.hold.set()
        await asyncio.wait_for(task, 5)
        assert seen == ["run 1, written [5, 6]"] and fetch.buffer.empty()
    finally:
        await fetch.stop(1)


# ---- fetcher -------------------------------------------------------------------------------

def fetcher(engine: ScriptedEngine, results: list[Settlement] | None = None,
            gate: asyncio.Event | None = None, **kw: Any) -> Fetcher:
    return Fetcher(engine, config(**kw), RuntimeCounters(), Holdings(),
                   [] if results is None else results, gate or open_event(), asyncio.Event(),
                   asyncio.Event())


async def test_fetcher_fills_the_buffer_up_to_prefetch_and_no_further() -> None:
    engine = ScriptedEngine()
    engine.ready = [delivery(i) for i in range(1, 11)]
    f = fetcher(engine, fetch_batch=3, prefetch=4)
    f.start("test")
    await until(lambda: f.buffer.qsize() == 4)
    await asyncio.sleep(0.03)
    assert engine.acquires == [3, 1] and len(f.held) == 4 and f.counters.acquired == 4
    f.buffer.get_nowait()
    f.room.set()  # a worker took one
    await until(lambda: f.buffer.qsize() == 4)
    assert engine.acquires[2] == 1
    unstarted = await f.stop(5)
    assert [d.id for d in unstarted] == [2, 3, 4, 5] and f.buffer.empty()


async def test_fetcher_stops_fetching_while_max_unflushed_results_wait() -> None:
    engine = ScriptedEngine()
    engine.ready = [delivery(1)]
    results = [Settlement(9, 1, Outcome.COMPLETE)]
    f = fetcher(engine, results, max_unflushed=1)
    f.start("test")
    await asyncio.sleep(0.05)
    assert engine.acquires == []
    results.clear()
    f.room.set()
    await until(lambda: f.buffer.qsize() == 1)
    await f.stop(5)


async def test_fetcher_takes_a_hand_over_while_idle_and_refuses_it_once_stopping() -> None:
    engine = ScriptedEngine()
    f = fetcher(engine)
    assert not f.idle_for("q")  # no acquire has shown the queue empty yet
    f.start("test")
    await until(lambda: f.caught_up)
    assert f.idle_for("q") and not f.idle_for("other")
    assert f.hand_over(delivery(1)) and f.idle_for("q")  # still nothing to fetch
    assert [d.id for d in await f.stop(5)] == [1]
    assert not f.idle_for("q")
    assert not f.hand_over(delivery(2)) and (2, 1) not in f.held


@pytest.mark.parametrize(("idle", "got", "limit", "expected"), [
    (0.5, 10, 10, (0.0, 0.0)),  # a full batch: again at once
    (0.5, 3, 10, (0.0, 0.01)),  # a partial one: soon
    (0.0, 0, 10, (0.005, 0.005)),  # nothing: back off from 5 ms ...
    (0.005, 0, 10, (0.01, 0.01)),  # ... doubling ...
    (0.015, 0, 10, (0.02, 0.02)),  # ... up to max_fetch_interval
])
def test_fetcher_polls_adaptively(idle: float, got: int, limit: int,
                                  expected: tuple[float, float]) -> None:
    assert _next_poll(config(), idle, got, limit) == expected


@pytest.mark.parametrize(("idle", "got", "start_in", "expected"), [
    (0.64, 0, 0.03, (1.0, 0.031)),  # backed off to 1 s: polls when the channel may start
    (0.0, 0, 0.03, (0.005, 0.005)),  # a backoff step comes first: it stays
    (0.64, 3, 0.0, (0.0, 0.001)),  # after a partial batch, even sooner than 10 ms
    (0.64, 0, None, (1.0, 1.0)),  # no channel waits for its rate
])
def test_fetcher_polls_when_a_channels_rate_lets_it_start_again(
        idle: float, got: int, start_in: float | None, expected: tuple[float, float]) -> None:
    cfg = config(max_fetch_interval=1.0)
    assert _next_poll(cfg, idle, got, 10, start_in) == pytest.approx(expected)


def test_fetch_size_grows_while_the_workers_outrun_the_fetcher_and_shrinks_when_caught_up(
) -> None:
    size = FetchSize(fetch_batch=500, prefetch=1000, workers=8)
    assert size.size == FETCH_FLOOR and size.limit(0) == FETCH_FLOOR
    grown = []
    for _ in range(8):  # a deep backlog: full batches, the buffer empty when each returns
        limit = size.limit(0)
        size.observe(limit, limit, 0)
        grown.append(size.size)
    assert grown == [32, 64, 128, 256, 500, 500, 500, 500]  # doubling up to fetch_batch
    size.observe(500, 500, 120)  # full, but the workers still had work: no bigger
    assert size.size == 500
    size.observe(130, 500, 0)  # short, but over a quarter: a flow about this size
    assert size.size == 500
    size.observe(120, 500, 0)  # under a quarter: the backlog is caught up
    size.observe(3, 250, 0)
    assert size.size == 125
    for _ in range(5):
        size.observe(0, size.size, 0)
    assert size.size == FETCH_FLOOR


def test_fetch_size_keeps_two_batches_buffered_within_prefetch() -> None:
    size = FetchSize(fetch_batch=500, prefetch=1000, workers=8)
    size.size = 400
    assert size.limit(0) == 400 and size.limit(500) == 300  # up to two batches
    assert size.limit(601) == 0  # less than half a batch free: not worth a round trip
    small = FetchSize(fetch_batch=3, prefetch=4, workers=8)
    assert (small.floor, small.limit(0), small.limit(3), small.limit(4)) == (3, 3, 1, 0)
    many = FetchSize(fetch_batch=500, prefetch=1000, workers=64)
    assert many.size == 64  # at least a batch for every worker
    capped = FetchSize(fetch_batch=500, prefetch=10, workers=64)
    assert capped.ceiling == capped.size == 10 and capped.limit(0) == 10


def test_fetch_size_drops_to_one_after_a_suspect_and_grows_back() -> None:
    """What is fetched while a suspect runs alone is handed back, and its neighbours are
    likely suspects too: after one, the next acquire asks for a single message."""
    size = FetchSize(fetch_batch=500, prefetch=1000, workers=8)
    size.size = 500
    size.after_suspect()
    assert size.limit(0) == 1 and size.limit(1) == 1 and size.limit(2) == 0
    size.observe(1, 1, 0)  # full, the buffer drained: doubling, as from the floor
    assert size.size == 2
    size.observe(0, 2, 0)  # nothing ready: back to the floor, not below it
    assert size.size == FETCH_FLOOR


# ---- workers, through the composed runtime -------------------------------------------------

def runtime(engine: ScriptedEngine, handler: Callable[..., Any], **kw: Any) -> SubscriberRuntime:
    sub = Subscriber(config(**kw), HandlerAdapter(handler))
    return SubscriberRuntime(engine, sub, asyncio.Event())  # type: ignore[arg-type]


async def test_workers_run_handlers_and_record_what_decide_says() -> None:
    engine = ScriptedEngine()
    engine.ready = [delivery(1), delivery(2), delivery(3)]

    async def handle(msg: Any) -> None:
        if msg.id == 2:
            raise ValueError("boom")

    rt = runtime(engine, handle, workers=2)
    rt.start()
    await until(lambda: engine.written == {1, 2, 3})
    await rt.stop(1)
    outcomes = {s.id: s.outcome for b in engine.settled for s in b}
    assert outcomes == {1: Outcome.COMPLETE, 2: Outcome.RETRY, 3: Outcome.COMPLETE}
    assert (rt.counters.completed, rt.counters.retried, rt.running) == (2, 1, 0)


async def test_a_worker_skips_a_delivery_whose_lease_was_lost() -> None:
    engine = ScriptedEngine()
    ran: list[int] = []

    async def handle(msg: Any) -> None:
        ran.append(msg.id)

    rt = runtime(engine, handle, workers=1)
    rt.holdings.lost.add((1, 1))
    rt.start()
    await until(lambda: rt.fetcher.caught_up)
    assert rt.hand_over(delivery(1)) and rt.hand_over(delivery(2))
    await until(lambda: ran == [2] and not rt.holdings.held)
    await rt.stop(1)
    assert rt.holdings.lost == set()


async def test_a_publish_is_handed_over_while_a_worker_is_free_after_the_buffered() -> None:
    """A burst of publishes hands several deliveries over in one loop turn, before any
    worker has taken the first: each still finds a worker free for it. Once the buffered
    and the running fill the workers, or a backlog was seen, publishes go the long way."""
    engine = ScriptedEngine()
    release = asyncio.Event()

    async def handle(msg: Any) -> None:
        await release.wait()

    rt = runtime(engine, handle, workers=3)
    rt.start()
    await until(lambda: rt.fetcher.caught_up)
    assert rt.takes_direct("q") and not rt.takes_direct("other")
    for i in (1, 2):  # the same turn: both wait in the buffer
        assert rt.takes_direct("q") and rt.hand_over(delivery(i))
    assert rt.fetcher.buffer.qsize() == 2 and rt.takes_direct("q")
    assert rt.hand_over(delivery(3)) and not rt.takes_direct("q")  # 3 buffered, 3 workers
    await until(lambda: rt.running == 3)
    assert not rt.takes_direct("q")  # all three busy
    release.set()
    await until(lambda: rt.running == 0 and rt.takes_direct("q"))
    rt.fetcher.caught_up = False  # an acquire came back full: a backlog may wait
    assert not rt.takes_direct("q")
    await rt.stop(1)


async def test_a_worker_cancelled_from_outside_is_replaced_and_its_delivery_given_back() -> None:
    engine = ScriptedEngine()
    started = asyncio.Event()

    async def handle(msg: Any) -> None:
        if msg.deliveries == 1:
            started.set()
            await asyncio.sleep(3600)

    rt = runtime(engine, handle, workers=1)
    rt.start()
    await until(lambda: rt.fetcher.caught_up)
    rt.hand_over(delivery(1))
    await asyncio.wait_for(started.wait(), 5)
    (worker,) = rt.workers.tasks
    worker.cancel()
    await until(lambda: engine.written == {1})
    (given_back,) = [s for b in engine.settled for s in b]
    assert (given_back.outcome, given_back.error) == (Outcome.RELEASE, "its worker was cancelled")
    assert rt.workers.tasks[0] is not worker and not rt.workers.tasks[0].done()
    await rt.stop(1)


async def test_stop_gives_back_buffered_and_cut_short_deliveries_then_flushes() -> None:
    engine = ScriptedEngine()
    started = asyncio.Event()

    async def handle(msg: Any) -> None:
        started.set()
        await asyncio.sleep(3600)

    rt = runtime(engine, handle, workers=1)
    rt.start()
    await until(lambda: rt.fetcher.caught_up)
    rt.hand_over(delivery(1))
    rt.hand_over(delivery(2))
    await asyncio.wait_for(started.wait(), 5)
    await rt.stop(0.05)
    released = {s.id: s for b in engine.settled for s in b}
    assert released[2].refund and released[2].outcome is Outcome.RELEASE  # never started
    assert (released[1].outcome, released[1].error, released[1].refund) == (
        Outcome.RELEASE, "cancelled on shutdown", False)
    assert rt.counters.released == 2 and rt.running == 0
