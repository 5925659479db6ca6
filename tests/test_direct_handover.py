"""A single publish to a queue whose subscriber in this process has nothing to do is
written already acquired and handed straight to it (SQLite, MariaDB and the in-memory
engine): one round trip
from publish to handler. The row must be the one an acquire leaves, the usual lifecycle must
follow, and the hand-over must never happen where it would overtake or lose work."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import sqlmq.publisher
from sqlmq import Broker, Message
from sqlmq.handover import hand_over, idle_runtime

from .conftest import archived, rows, wait_until

pytestmark = pytest.mark.parametrize("db_kind", ["memory", "sqlite", "mariadb"])


async def _caught_up(broker: Broker) -> None:
    await wait_until(lambda: all(r.fetcher.caught_up for r in broker.runtimes),
                     message="the subscriber's first acquire")


def _stall_acquire(broker: Broker) -> asyncio.Event:
    """From now on the fetch loop's acquire returns nothing, and only once the event is set:
    until then, only a hand-over can deliver."""
    unstall = asyncio.Event()

    async def stalled(*_: Any) -> list[Any]:
        await unstall.wait()
        return []

    broker.engine.acquire = stalled  # type: ignore[method-assign]
    return unstall


async def test_an_idle_subscriber_gets_the_message_without_an_acquire(broker: Broker) -> None:
    got: list[Message] = []
    started = asyncio.Event()
    release = asyncio.Event()

    @broker.subscriber("jobs", lease=30)
    async def handle(msg: Message) -> None:
        got.append(msg)
        started.set()
        await release.wait()

    await broker.start()
    await _caught_up(broker)
    unstall = _stall_acquire(broker)

    msg_id = await broker.publish("jobs", {"n": 1}, headers={"k": "v"})
    await asyncio.wait_for(started.wait(), 10)

    (msg,) = got
    assert (msg.id, msg.body, msg.headers["k"], msg.deliveries, msg.attempts) == (
        msg_id, {"n": 1}, "v", 1, 0)
    (row,) = await rows(broker, id=msg_id)
    # The row an acquire leaves: leased, one delivery, no longer scheduled.
    assert row["state"] == "PROCESSING" and row["deliveries_count"] == 1
    assert row["attempts_count"] == 0 and row["next_attempt_at"] is None
    assert row["first_attempt_at"] == row["acquired_at"] == msg.created_at == row["created_at"]
    assert row["lease_expires_at"] - row["acquired_at"] == timedelta(seconds=30)
    assert row["lease_expires_at"] == msg._delivery.lease_expires_at
    release.set()
    done = await archived(broker, msg_id)
    assert done["state"] == "COMPLETED" and done["attempts_count"] == 1
    assert broker.runtimes[0].counters.acquired == 1
    unstall.set()


async def test_a_handed_over_message_that_fails_is_retried_as_usual(broker: Broker) -> None:
    calls: list[int] = []

    @broker.subscriber("jobs", max_fetch_interval=0.05)
    async def handle(msg: Message) -> None:
        calls.append(msg.deliveries)
        if msg.deliveries == 1:
            await msg.nack(delay=0)

    await broker.start()
    await _caught_up(broker)
    msg_id = await broker.publish("jobs", "x")
    done = await archived(broker, msg_id)
    assert calls == [1, 2]
    assert done["state"] == "COMPLETED" and done["attempts_count"] == 2
    assert [e["ended"] for e in done["history"]] == ["nacked"]


async def test_no_hand_over_with_a_delay_a_backlog_or_a_busy_subscriber(
    broker: Broker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = asyncio.Event()
    running = 0

    @broker.subscriber("jobs", workers=1, fetch_batch=1, prefetch=1)
    async def handle(msg: Message) -> None:
        nonlocal running
        running += 1
        await release.wait()

    handed: list[int] = []

    async def spy(*args: Any) -> int:
        handed.append(msg_id := await hand_over(*args))
        return msg_id

    monkeypatch.setattr(sqlmq.publisher, "hand_over", spy)
    # Before the first acquire, the subscriber does not know whether a backlog waits.
    first = await broker.publish("jobs", "backlog")
    assert (await rows(broker, id=first))[0]["state"] == "PENDING"
    await broker.start()
    try:
        await wait_until(lambda: running == 1, message="the first message to start")
        # Its one worker is busy: new messages go through the queue like any other.
        busy = await broker.publish("jobs", "while busy")
        behind = await broker.publish("jobs", "behind it")
        await broker.publish("jobs", "later", delay=60)
        other = await broker.publish("other-queue", "no subscriber here")
        assert handed == []
        assert [r["state"] for r in await rows(broker, id=other)] == ["PENDING"]
    finally:
        release.set()
    await archived(broker, busy)
    await archived(broker, behind)
    # Idle again, with the delayed message still waiting: now a publish is handed over.
    await wait_until(lambda: broker.runtimes[0].takes_direct("jobs"), message="idle")
    assert [await broker.publish("jobs", "now")] == handed


async def test_a_subscriber_stopping_meanwhile_gets_nothing_and_the_message_waits(
    broker: Broker,
) -> None:
    @broker.subscriber("jobs")
    async def handle(msg: Message) -> None:
        raise AssertionError("must not run")

    await broker.start()
    await _caught_up(broker)
    (runtime,) = broker.runtimes
    # Chosen while idle, stopping by the time the row is written. The fetch loop is
    # stopped, not only flagged: an idle subscriber still polls (every max_fetch_interval
    # on MariaDB), and a poll in flight when the row commits acquires it, as a stop's last
    # acquire may (a CI run saw the handler run here on MariaDB).
    assert idle_runtime(broker.runtimes, broker._wakeups, _message("jobs")) is runtime
    assert await runtime.fetcher.stop(patience=10) == []

    msg_id = await hand_over(broker.engine, broker._wakeups, runtime, _message("jobs"))

    (row,) = await rows(broker, id=msg_id)
    assert row["state"] == "PENDING" and row["deliveries_count"] == 0
    assert row["attempts_count"] == 0
    assert not runtime.holdings.held


def _message(queue: str) -> Any:
    from sqlmq.publishing import prepare

    (m,) = prepare(queue, ["x"], headers=None, delay=None, at=None, max_payload_bytes=1000)
    return m
