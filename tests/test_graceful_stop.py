"""Graceful stop: fetching stops, unstarted messages go back without spending a delivery,
running handlers get ``graceful_timeout`` to finish and their results are written; what
overruns is cancelled and returned, never lost. The same holds for a worker process that
receives SIGTERM."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from sqlmq import Broker, Message

from .conftest import on_every_engine, rows, wait_until
from .procs import handled_ids, spawn_worker, terminate, worker_log


@on_every_engine
async def test_stop_returns_prefetched_messages_and_lets_running_handlers_finish(
    broker: Broker,
) -> None:
    started: list[int] = []
    release = asyncio.Event()

    # One acquire takes all twelve: two start, ten wait in the buffer (two free places are
    # less than half a batch, too few to fetch for; runtime.fetcher.FetchSize).
    @broker.subscriber("work", workers=2, fetch_batch=12, prefetch=12, flush_interval=0.01)
    async def handle(msg: Message) -> None:
        started.append(msg.id)
        await release.wait()

    ids = await broker.publish_batch("work", range(12))
    await broker.start()
    (runtime,) = broker.runtimes
    async def two_running_ten_prefetched() -> bool:
        return len(started) == 2 and await _count(broker, "PROCESSING") == 12

    await wait_until(two_running_ten_prefetched,
                     message="two handlers running and ten messages prefetched")

    stopping = asyncio.create_task(broker.stop())
    await wait_until(lambda: _has(broker, "PENDING", 10),
                     message="the prefetched messages given back while handlers still run")
    assert not stopping.done()
    release.set()
    await asyncio.wait_for(stopping, 60)

    unstarted = sorted(set(ids) - set(started))
    assert len(started) == 2, "stop() started a prefetched message"
    returned = await rows(broker, "message")
    assert [r["id"] for r in returned] == unstarted
    for r in returned:
        assert (r["state"], r["deliveries_count"], r["attempts_count"]) == ("PENDING", 0, 0)
        assert r["lease_expires_at"] is None and r["next_attempt_at"] is not None
        # as if never fetched: the refunded delivery leaves no times behind
        assert r["first_attempt_at"] is None and r["acquired_at"] is None
    archived = await rows(broker, "archive")
    assert [(r["id"], r["state"], r["deliveries_count"]) for r in archived] == [
        (i, "COMPLETED", 1) for i in sorted(started)]
    assert (runtime.counters.completed, runtime.counters.released) == (2, 10)


@on_every_engine
async def test_stop_cancels_a_handler_that_overruns_graceful_timeout_and_returns_its_message(
    broker: Broker,
) -> None:
    running = asyncio.Event()
    cancelled: list[int] = []
    deliveries: list[int] = []

    @broker.subscriber("stuck", graceful_timeout=0.5, flush_interval=0.01)
    async def handle(msg: Message) -> None:
        deliveries.append(msg.deliveries)
        if msg.deliveries > 1:
            return
        running.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(msg.id)
            raise

    msg_id = await broker.publish("stuck", "x")
    await broker.start()
    await asyncio.wait_for(running.wait(), 20)
    await asyncio.wait_for(broker.stop(), 60)

    assert cancelled == [msg_id]
    (returned,) = await rows(broker, id=msg_id)
    assert (returned["state"], returned["attempts_count"]) == ("PENDING", 0)
    assert returned["last_error"] == "cancelled on shutdown"
    assert returned["lease_expires_at"] is None and returned["next_attempt_at"] is not None
    assert await rows(broker, "archive") == []

    await broker.start()  # not lost: the next run handles it
    await wait_until(lambda: _has(broker, "archive", 1), message="the message archived")
    await broker.stop()
    assert deliveries == [1, 2]
    (archived,) = await rows(broker, "archive")
    assert (archived["id"], archived["state"], archived["deliveries_count"]) == (
        msg_id, "COMPLETED", 2)


MESSAGES = 2000


@pytest.mark.parametrize("launcher", ["asyncio.run", "sqlmq worker"])
async def test_sigterm_stops_a_worker_process_cleanly_without_losing_messages(
    broker: Broker, db_url: str, prefix: str, tmp_path: Path, launcher: str
) -> None:
    out = tmp_path / "worker.ids"
    command = None
    if launcher == "sqlmq worker":
        command = [str(Path(sys.executable).with_name("sqlmq")), "worker", "tests.procs:broker"]
    published = await broker.publish_batch("orders", range(MESSAGES))
    # 8 workers x 50 ms per message: SIGTERM lands long before the queue could drain.
    proc = spawn_worker(db_url, prefix, "orders", out, sleep=0.05, command=command)
    try:
        await wait_until(lambda: len(handled_ids(out)) >= 20, timeout=60,
                         message="the worker process handling messages")
    finally:
        code = terminate(proc)
    assert code == 0, worker_log(out)

    handled = handled_ids(out)
    assert len(handled) == len(set(handled)) < MESSAGES
    archived = await rows(broker, "archive")
    assert sorted(r["id"] for r in archived) == sorted(handled), "a result was not flushed"
    assert {(r["state"], r["deliveries_count"]) for r in archived} == {("COMPLETED", 1)}
    left = await rows(broker, "message")
    assert sorted(handled + [r["id"] for r in left]) == sorted(published)
    assert {(r["state"], r["deliveries_count"]) for r in left} == {("PENDING", 0)}
    assert all(r["lease_expires_at"] is None for r in left)


async def _count(broker: Broker, state: str) -> int:
    """Rows in one state of the message table, or in the archive for ``"archive"``."""
    if state == "archive":
        return len(await rows(broker, "archive"))
    return len(await rows(broker, state=state))


async def _has(broker: Broker, state: str, n: int) -> bool:
    return await _count(broker, state) == n
