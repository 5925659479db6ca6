"""Every transition of the message lifecycle (seed chart), observed in the rows.

PENDING ─acquire─▶ PROCESSING ─ack─▶ COMPLETED, ─reject─▶ FAILED, ─nack─▶ RETRYABLE or
FAILED (no retries left); RETRYABLE ─acquire─▶ PROCESSING; a delivery beyond
``max_deliveries`` is FAILED without running the handler.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from sqlmq import Broker, Message, Retry

from .conftest import archived, on_every_engine, passes, rows, sibling, wait_until

pytestmark = on_every_engine

FAST = {"flush_interval": 0.01, "max_fetch_interval": 0.05}


async def in_state(broker: Broker, msg_id: int, state: str) -> Any:
    """Wait until ``msg_id`` is in the message table in ``state`` and return its row."""
    found: list[Any] = []

    async def check() -> bool:
        found[:] = await rows(broker, id=msg_id)
        return bool(found) and found[0]["state"] == state

    await wait_until(check, message=f"message {msg_id} in state {state}")
    return found[0]


async def test_published_message_is_pending_and_ready_now(broker: Broker) -> None:
    msg_id = await broker.publish("q", "hello")
    now = await broker.engine.now()

    (row,) = await rows(broker, id=msg_id)
    assert row["state"] == "PENDING"
    assert row["deliveries_count"] == 0
    assert row["attempts_count"] == 0
    assert row["acquired_at"] is None
    assert row["lease_expires_at"] is None
    assert row["first_attempt_at"] is None
    assert row["next_attempt_at"] is not None
    assert row["next_attempt_at"] <= now
    assert await rows(broker, "archive") == []


async def test_acquired_message_is_processing_with_a_lease_and_no_schedule(
    broker: Broker,
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @broker.subscriber("q", lease=30, **FAST)
    async def handle(msg: Message) -> None:
        started.set()
        await release.wait()

    msg_id = await broker.publish("q", "hello")
    await broker.start()
    try:
        await asyncio.wait_for(started.wait(), 20)
        (row,) = await rows(broker, id=msg_id)
        now = await broker.engine.now()
    finally:
        release.set()
        await broker.stop()

    assert row["state"] == "PROCESSING"
    assert row["deliveries_count"] == 1
    assert row["attempts_count"] == 0
    assert row["next_attempt_at"] is None  # the invariant: NULL exactly while PROCESSING
    assert row["acquired_at"] is not None and row["acquired_at"] <= now
    assert row["first_attempt_at"] == row["acquired_at"]
    lease = row["lease_expires_at"] - row["acquired_at"]
    assert timedelta(seconds=29) <= lease <= timedelta(seconds=31)


async def test_handled_message_is_archived_completed_and_leaves_the_message_table(
    broker: Broker,
) -> None:
    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        pass

    msg_id = await broker.publish("q", {"n": 1})
    await broker.start()
    try:
        row = await archived(broker, msg_id)
    finally:
        await broker.stop()

    assert await rows(broker, id=msg_id) == []
    assert row["state"] == "COMPLETED"
    assert row["attempts_count"] == 1
    assert row["deliveries_count"] == 1
    assert row["error"] is None
    assert row["first_attempt_at"] <= row["last_attempt_at"] <= row["archived_at"]
    assert row["created_at"] <= row["first_attempt_at"]


async def test_rejected_message_is_archived_failed_with_the_reason(broker: Broker) -> None:
    calls: list[int] = []

    @broker.subscriber("q", retry=Retry.constant(0.01), **FAST)
    async def handle(msg: Message) -> None:
        calls.append(msg.deliveries)
        await msg.reject("invalid order")

    msg_id = await broker.publish("q", {"n": 1})
    await broker.start()
    try:
        row = await archived(broker, msg_id)
    finally:
        await broker.stop()

    assert calls == [1]  # a reject is final even though retries were left
    assert await rows(broker, id=msg_id) == []
    assert row["state"] == "FAILED"
    assert row["error"] == "invalid order"
    assert row["attempts_count"] == 1
    assert row["deliveries_count"] == 1


async def test_nacked_message_with_retries_left_becomes_retryable_on_the_db_clock(
    broker: Broker,
) -> None:
    @broker.subscriber("q", retry=Retry.constant(60), **FAST)
    async def handle(msg: Message) -> None:
        raise ValueError("boom")

    msg_id = await broker.publish("q", "x")
    await broker.start()
    try:
        row = await in_state(broker, msg_id, "RETRYABLE")
        now = await broker.engine.now()
    finally:
        await broker.stop()

    assert row["attempts_count"] == 1
    assert row["deliveries_count"] == 1
    assert row["last_error"].split("\n\n", 1)[0] == "ValueError: boom"  # then the traceback
    assert row["lease_expires_at"] is None
    assert row["next_attempt_at"] > now
    gap = (row["next_attempt_at"] - row["last_attempt_at"]).total_seconds()
    assert abs(gap - 60) < 1
    assert [h["ended"] for h in row["history"]] == ["error"]
    assert await rows(broker, "archive") == []


async def test_retryable_message_is_delivered_again_and_completed(broker: Broker) -> None:
    seen: list[tuple[int, int]] = []

    @broker.subscriber("q", retry=Retry.constant(0.05), **FAST)
    async def handle(msg: Message) -> None:
        seen.append((msg.attempts, msg.deliveries))
        if len(seen) == 1:
            raise ValueError("first try fails")

    msg_id = await broker.publish("q", "x")
    await broker.start()
    try:
        row = await archived(broker, msg_id)
    finally:
        await broker.stop()

    assert seen == [(0, 1), (1, 2)]
    assert row["state"] == "COMPLETED"
    assert row["attempts_count"] == 2
    assert row["deliveries_count"] == 2
    assert row["error"] is None
    assert row["first_attempt_at"] < row["last_attempt_at"]
    assert [h["ended"] for h in row["history"]] == ["error"]


async def test_nack_without_retries_left_archives_failed(broker: Broker) -> None:
    calls: list[int] = []

    @broker.subscriber("q", retry=Retry.constant(0.01, max_attempts=2), **FAST)
    async def handle(msg: Message) -> None:
        calls.append(msg.deliveries)
        raise ValueError("boom")

    msg_id = await broker.publish("q", "x")
    await broker.start()
    try:
        row = await archived(broker, msg_id)
    finally:
        await broker.stop()

    assert calls == [1, 2]
    assert row["state"] == "FAILED"
    assert row["attempts_count"] == 2
    assert row["deliveries_count"] == 2
    assert row["error"].split("\n\n", 1)[0] == (
        "retries exhausted after 2 attempt(s): ValueError: boom")
    assert await rows(broker, id=msg_id) == []


async def test_delivery_beyond_max_deliveries_fails_without_running_the_handler(
    broker: Broker, db_url: str, prefix: str
) -> None:
    # A handler that never finishes, a short lease that is not renewed: the lease expires,
    # recovery hands the message out again, and the second delivery exceeds the limit.
    b = sibling(broker, db_url, prefix, recovery_interval=0.1, recovery_spread=0)
    calls: list[int] = []
    never = asyncio.Event()

    @b.subscriber("q", workers=2, lease=0.3, renew_leases=False, max_deliveries=1,
                  graceful_timeout=0.2, **FAST)
    async def handle(msg: Message) -> None:
        calls.append(msg.deliveries)
        await never.wait()

    msg_id = await b.publish("q", "poison")
    await b.start()
    try:
        await wait_until(lambda: calls, message="the first delivery")
        await passes(b, 0.3)  # its lease runs out (at once on the in-memory engine)
        row = await archived(b, msg_id)
        (runtime,) = b.runtimes
    finally:
        await b.close()

    assert calls == [1]
    assert row["state"] == "FAILED"
    assert row["deliveries_count"] == 2
    assert row["attempts_count"] == 0  # the handler never finished an attempt
    assert row["error"] == "max deliveries exceeded (2 > 1)"
    assert [h["ended"] for h in row["history"]] == ["lease_expired", "max_deliveries"]
    # the first, stuck delivery was cut short on stop; its late result could not land
    assert runtime.counters.failed == 1
    assert runtime.counters.completed == 0
