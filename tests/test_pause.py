"""Pausing a queue: nothing takes its messages (plain or channel, fetched or handed over,
in this process or another) until it is resumed, and publishing goes on; then everything
is processed. On every engine, and with a real worker process on every database. Waits
are for conditions (polls counted, heartbeats seen), never for fixed times."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sqlmq import Broker, ConfigurationError, Message, PausedQueue
from sqlmq.records import NewMessage

from .conftest import on_every_engine, rows, sibling, wait_until
from .procs import handled_ids, ready_marker, spawn_worker, terminate, worker_log

QUICK = dict(max_fetch_interval=0.02, flush_interval=0.0)


def count_acquires(broker: Broker) -> list[int]:
    """From now on, ``[n]``: how many acquires the broker's subscribers have made."""
    engine = broker.engine
    real = engine.acquire
    made = [0]

    async def counted(*args: Any, **kwargs: Any) -> Any:
        made[0] += 1
        return await real(*args, **kwargs)

    engine.acquire = counted  # type: ignore[method-assign]
    return made


async def polls(made: list[int], n: int = 5) -> None:
    """Wait until ``n`` more acquires have run (each found what it found)."""
    target = made[0] + n
    await wait_until(lambda: made[0] >= target, message=f"{n} more acquires")


async def untouched(broker: Broker, queue: str, ids: list[int]) -> None:
    """The messages ``ids`` of ``queue`` are all still waiting, never delivered."""
    found = await rows(broker, queue=queue)
    assert sorted(r["id"] for r in found) == sorted(ids)
    assert {(r["state"], r["deliveries_count"]) for r in found} == {("PENDING", 0)}


@on_every_engine
async def test_a_paused_queue_waits_until_resumed_while_its_neighbour_runs(
        broker: Broker) -> None:
    handled: list[tuple[str, int]] = []

    @broker.subscriber(["jobs", "other"], **QUICK)
    async def handle(msg: Message) -> None:
        handled.append((msg.queue, msg.id))

    assert await broker.pause("jobs") is True
    made = count_acquires(broker)
    await broker.start()
    try:
        ids = await broker.publish_batch("jobs", range(4))
        ids.append(await broker.publish("jobs", "one more"))  # a hand-over, where there is one
        other = await broker.publish("other", "runs")
        await wait_until(lambda: ("other", other) in handled, message="the other queue")
        await polls(made)
        assert [h for h in handled if h[0] == "jobs"] == []
        await untouched(broker, "jobs", ids)

        assert await broker.resume("jobs") is True
        await wait_until(lambda: len(handled) == 6, message="every message handled")
    finally:
        await broker.stop()
    assert sorted(i for q, i in handled if q == "jobs") == sorted(ids)
    done = await rows(broker, "archive", queue="jobs")
    assert sorted(r["id"] for r in done) == sorted(ids)
    assert {r["state"] for r in done} == {"COMPLETED"}


@on_every_engine
async def test_the_hand_over_of_a_publish_does_not_bypass_a_pause(broker: Broker) -> None:
    """An idle subscriber of this process gets a publish straight away (written already
    acquired) where the engine hands over; not while the queue is paused: the publish is
    then an ordinary one, and its message waits."""
    got: list[int] = []

    @broker.subscriber("jobs", **QUICK)
    async def handle(msg: Message) -> None:
        got.append(msg.id)

    engine = broker.engine
    leased: list[Any] = []
    real = engine.publish_leased

    async def spied(message: NewMessage, lease: float) -> Any:
        leased.append(d := await real(message, lease))
        return d

    engine.publish_leased = spied  # type: ignore[method-assign]
    made = count_acquires(broker)
    await broker.start()
    try:
        (runtime,) = broker.runtimes
        await wait_until(lambda: runtime.takes_direct("jobs"), message="an idle subscriber")
        first = await broker.publish("jobs", 1)
        await wait_until(lambda: first in got, message="the first message")
        if engine.hands_over:
            assert [d.id for d in leased] == [first]  # handed over, as usual

        assert await broker.pause("jobs")
        await wait_until(lambda: runtime.takes_direct("jobs"), message="an idle subscriber")
        second = await broker.publish("jobs", 2)
        if engine.hands_over:
            assert leased[1:] == [None]  # tried, refused: nothing written leased
        await polls(made)
        assert got == [first]
        await untouched(broker, "jobs", [second])

        if engine.hands_over:  # the engine call alone, on the paused queue
            assert await engine.publish_leased(NewMessage("jobs", b"x", {}, 0.0, None), 30) \
                is None
            await untouched(broker, "jobs", [second])

        await broker.resume("jobs")
        await wait_until(lambda: second in got, message="the second message, once resumed")
    finally:
        await broker.stop()


@on_every_engine
async def test_a_paused_queues_channel_messages_wait_too(broker: Broker) -> None:
    got: list[int] = []

    @broker.subscriber("jobs", **QUICK)
    async def handle(msg: Message) -> None:
        got.append(msg.id)

    await broker.set_channel("in-order", ordered=True, queue="jobs")
    await broker.set_channel("limited", max_concurrency=2, queue="jobs")
    await broker.pause("jobs")
    ids = []
    for channel in ("in-order", "limited", "plain"):
        ids += await broker.publish_batch("jobs", range(3), channel=channel)
    made = count_acquires(broker)
    await broker.start()
    try:
        await polls(made)
        assert got == []
        await untouched(broker, "jobs", ids)

        await broker.resume("jobs")
        await wait_until(lambda: len(got) == len(ids), message="every channel's messages")
    finally:
        await broker.stop()
    assert sorted(got) == sorted(ids)


@on_every_engine
async def test_pause_resume_and_the_list_of_paused_queues(
        broker: Broker, db_url: str, prefix: str) -> None:
    """A queue is a name: any may be paused, one never used included. Pausing twice or
    resuming what is not paused changes nothing (and says so). Another broker on the tables
    sees the pause. Names are exact: ``Jobs`` and ``jobs `` are other queues."""
    before = await broker.engine.now()
    assert await broker.pause("never-used") is True
    assert await broker.pause("jobs") is True
    assert await broker.pause("jobs") is False
    after = await broker.engine.now()
    found = await broker.paused()
    assert [p.queue for p in found] == ["jobs", "never-used"]
    assert all(isinstance(p, PausedQueue) and before <= p.paused_at <= after for p in found)

    other = sibling(broker, db_url, prefix)
    try:
        assert [p.queue for p in await other.paused()] == ["jobs", "never-used"]
        assert await other.resume("never-used") is True
    finally:
        await other.close()
    assert await broker.resume("never-used") is False
    assert [p.queue for p in await broker.paused()] == ["jobs"]

    jobs = await broker.publish("jobs", 1)
    upper = await broker.publish("Jobs", 2)
    padded = await broker.publish("jobs ", 3)
    engine = broker.engine
    assert await engine.acquire(["jobs"], 10, 30) == []
    assert [d.id for d in await engine.acquire(["jobs", "Jobs"], 10, 30)] == [upper]
    assert [d.id for d in await engine.acquire(["jobs "], 10, 30)] == [padded]
    assert await broker.resume("jobs") is True
    assert await broker.paused() == []
    assert [d.id for d in await engine.acquire(["jobs"], 10, 30)] == [jobs]


@on_every_engine
async def test_resume_wakes_this_processes_subscribers(broker: Broker) -> None:
    woken: list[str] = []
    real = broker._wakeups.wake

    def spied(queue: str) -> None:
        woken.append(queue)
        real(queue)

    broker._wakeups.wake = spied  # type: ignore[method-assign]
    await broker.pause("jobs")
    assert woken == []
    await broker.resume("jobs")
    assert woken == ["jobs"]
    await broker.resume("jobs")  # not paused: nothing to wake for
    assert woken == ["jobs"]


@on_every_engine
async def test_a_bad_queue_name_is_refused_clearly(broker: Broker) -> None:
    for bad in ["", 7, None, "x" * 129, "a\x00b"]:
        for call in (broker.pause, broker.resume):
            with pytest.raises(ConfigurationError, match="queue name"):
                await call(bad)
    assert await broker.paused() == []


async def test_a_pause_holds_for_a_worker_process_too(
        broker: Broker, db_url: str, prefix: str, tmp_path: Path) -> None:
    """A worker process (polling every 0.2 s) takes nothing of a queue paused by this one
    for as long as it is paused, then everything: every message's first delivery is after
    the resume, on the database clock."""
    assert await broker.pause("jobs")
    ids = await broker.publish_batch("jobs", range(20))
    out = tmp_path / "worker.ids"
    proc = spawn_worker(db_url, prefix, "jobs", out, heartbeat=0.2)
    try:
        await wait_until(lambda: ready_marker(out).exists(), timeout=60,
                         message="the worker process running")

        async def its_heartbeat() -> Any:
            found = [w.heartbeat_at for w in await broker.workers() if w.pid == proc.pid]
            return found[0] if found else None

        await wait_until(its_heartbeat, timeout=60, message="the worker process listed")
        first = await its_heartbeat()

        async def polled_a_while() -> bool:  # its fetcher runs on the same event loop
            beat = await its_heartbeat()
            return beat is not None and beat >= first + timedelta(seconds=2)

        await wait_until(polled_a_while, timeout=60, message="two seconds of its heartbeats")
        assert handled_ids(out) == []
        await untouched(broker, "jobs", ids)

        resumed_at = await broker.engine.now()
        assert await broker.resume("jobs")
        await wait_until(lambda: sorted(handled_ids(out)) == sorted(ids), timeout=60,
                         message="every message handled by the worker process")
        await wait_until(lambda: _archived(broker, len(ids)), message="archived")
        done = await rows(broker, "archive", queue="jobs")
        assert all(r["first_attempt_at"] >= resumed_at for r in done), (resumed_at, done)
    finally:
        code = terminate(proc)
    assert code == 0, worker_log(out)


async def _archived(broker: Broker, n: int) -> bool:
    return len(await rows(broker, "archive", queue="jobs")) == n



async def test_the_spark_source_lease_respects_a_pause(broker: Broker) -> None:
    """The Spark source leases with each engine's own acquire statements (run here without
    Spark, through its ledger): nothing of a paused queue, everything once resumed."""
    from sqlmq.engines.spark import ledger_for

    ids = await broker.publish_batch("jobs", range(3))
    await broker.pause("jobs")
    ledger = ledger_for(broker.sync_db, broker.schema)

    def take(seq: int) -> list[int]:
        with broker.sync_db.begin() as conn:
            return sorted(lease[0] for lease in ledger.take(conn, "jobs", "stream", seq, 10,
                                                             30.0))

    assert await asyncio.to_thread(take, 1) == []
    await untouched(broker, "jobs", ids)
    await broker.resume("jobs")
    assert await asyncio.to_thread(take, 2) == sorted(ids)
