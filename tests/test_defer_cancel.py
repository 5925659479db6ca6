"""Defer with saved state and cancellation through the broker, on every engine: the state a
handler saves reaches its next delivery, defers count as neither attempts nor deliveries
against max_deliveries (1,000 of them never dead-letter a message), and cancel stops a
waiting message, a running one (in this process and in another) and one that went back to
waiting flagged. The engine rules are ``tests/contract/test_defer_cancel.py``."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from sqlmq import Broker, Message, Retry, State

from .conftest import (
    archived,
    drop_tables,
    on_every_engine,
    on_memory,
    rows,
    sibling,
    update_row,
    wait_for_count,
    wait_until,
)

pytestmark = on_every_engine

# Deferred messages are due at once in these tests: the subscriber looks again soon after
# a flush, and within max_fetch_interval anyway.
QUICK = dict(flush_interval=0.0, max_fetch_interval=0.05)


async def test_state_saved_by_a_defer_reaches_the_next_delivery(broker: Broker) -> None:
    seen: list[tuple[Any, int, int, int]] = []

    @broker.subscriber("jobs", retry=Retry.constant(0.0, max_attempts=3), **QUICK)
    async def step(msg: Message) -> None:
        seen.append((msg.state, msg.defers, msg.attempts, msg.deliveries))
        progress = msg.state or {"done": 0}
        if progress["done"] == 2 and msg.attempts == 0:
            raise RuntimeError("a real failure is still a failure")
        if progress["done"] < 3:
            await msg.defer(state={"done": progress["done"] + 1})

    (msg_id,) = [await broker.publish("jobs", {"n": 1})]
    await broker.start()
    row = await archived(broker, msg_id)
    await broker.stop()
    assert seen == [(None, 0, 0, 1), ({"done": 1}, 1, 0, 2), ({"done": 2}, 2, 0, 3),
                    ({"done": 2}, 2, 1, 4), ({"done": 3}, 3, 1, 5)]
    assert (row["state"], row["attempts_count"], row["deliveries_count"]) == (
        State.COMPLETED, 2, 5)


async def test_a_defer_keeps_the_saved_state_unless_given_and_waits(broker: Broker) -> None:
    seen: list[Any] = []

    @broker.subscriber("jobs", **QUICK)
    def step(msg: Message) -> None:  # a sync handler defers without awaiting
        seen.append(msg.state)
        if len(seen) == 1:
            msg.defer(state=b"\x00bytes")
        elif len(seen) == 2:
            msg.defer(timedelta(milliseconds=300))  # the state stays
        elif len(seen) == 3:
            msg.defer(state=None)  # cleared

    msg_id = await broker.publish("jobs", "x")
    await broker.start()
    await wait_until(lambda: len(seen) >= 2, message="second delivery")
    if on_memory(broker):
        broker.engine.advance(0.3)  # type: ignore[attr-defined]
    await wait_until(lambda: len(seen) >= 4, message="fourth delivery")
    await archived(broker, msg_id)
    await broker.stop()
    assert seen == [None, b"\x00bytes", b"\x00bytes", None]


#: Defers of one message, each a delivery: far past max_deliveries=2 and the retry limit.
#: (1,000 took 45 s on SQLite in the parallel suite, one settle and acquire after another.)
DEFERS = 300


async def test_hundreds_of_defers_never_dead_letter_a_message(broker: Broker) -> None:
    counts: list[int] = []

    @broker.subscriber("loop", max_deliveries=2, workers=1, **QUICK)
    async def again(msg: Message) -> None:
        counts.append(msg.attempts)
        if msg.defers < DEFERS:
            await msg.defer(state=msg.defers)

    msg_id = await broker.publish("loop", "x")
    await broker.start()
    await wait_for_count(lambda: len(counts), DEFERS + 1,
                         message="deliveries of the deferring message")
    row = await archived(broker, msg_id)
    await broker.stop()
    assert row["state"] == State.COMPLETED
    assert (row["attempts_count"], row["deliveries_count"]) == (1, DEFERS + 1)
    assert set(counts) == {0} and len(counts) == DEFERS + 1


async def test_cancel_of_a_waiting_message_means_it_never_runs(broker: Broker) -> None:
    ran: list[int] = []

    @broker.subscriber("jobs", **QUICK)
    async def handle(msg: Message) -> None:
        ran.append(msg.id)

    doomed = await broker.publish("jobs", "x", delay=0.5)
    kept = await broker.publish("jobs", "y", delay=0.5)
    answer = await broker.cancel(doomed)
    assert (answer.outcome, answer.state) == ("cancelled", State.CANCELLED)
    await broker.start()
    if on_memory(broker):
        broker.engine.advance(0.5)  # type: ignore[attr-defined]
    await archived(broker, kept)
    await broker.stop()
    assert ran == [kept]
    (row,) = await rows(broker, "archive", id=doomed)
    assert (row["state"], row["deliveries_count"]) == (State.CANCELLED, 0)
    assert (await broker.cancel(doomed)).outcome == "archived"
    assert (await broker.cancel(kept)).state == State.COMPLETED
    assert (await broker.cancel(10**9)).outcome == "unknown"


async def test_cancel_of_a_running_message_in_this_process(broker: Broker) -> None:
    started = asyncio.Event()

    @broker.subscriber("jobs", **QUICK)
    async def long(msg: Message) -> None:
        started.set()
        while not msg.cancel_requested:
            await asyncio.sleep(0.01)
        if msg.body == "finish anyway":
            return  # a success still completes it
        raise RuntimeError("stopped early")

    first = await broker.publish("jobs", "stop early")
    await broker.start()
    await asyncio.wait_for(started.wait(), 10)
    answer = await broker.cancel(first)
    assert answer.outcome == "requested"
    row = await archived(broker, first)
    assert (row["state"], row["attempts_count"]) == (State.CANCELLED, 0)
    assert "stopped early" in row["error"]
    started.clear()
    second = await broker.publish("jobs", "finish anyway")
    await asyncio.wait_for(started.wait(), 10)
    await broker.cancel(second)
    assert (await archived(broker, second))["state"] == State.COMPLETED
    await broker.stop()


async def test_cancel_from_another_process_reaches_the_handler(
        broker: Broker, db_url: str, prefix: str) -> None:
    started = asyncio.Event()
    polls: list[bool] = []

    # a short lease: the lease keeper, which reads cancellations, runs every 0.2 s
    @broker.subscriber("jobs", lease=0.6, **QUICK)
    async def long(msg: Message) -> None:
        started.set()
        while not msg.cancel_requested:
            polls.append(False)
            await asyncio.sleep(0.02)
        await msg.defer(state="would run again")  # a defer of a cancelled message ends it

    msg_id = await broker.publish("jobs", "x")
    await broker.start()
    await asyncio.wait_for(started.wait(), 10)
    other = sibling(broker, db_url, prefix)
    try:
        assert (await other.cancel(msg_id)).outcome == "requested"
    finally:
        await other.close()
    row = await archived(broker, msg_id)
    await broker.stop()
    assert row["state"] == State.CANCELLED and polls


async def test_a_flagged_message_back_in_the_queue_is_cancelled_unrun(broker: Broker) -> None:
    ran: list[int] = []

    @broker.subscriber("jobs", **QUICK)
    async def handle(msg: Message) -> None:
        ran.append(msg.id)

    msg_id = await broker.publish("jobs", "x")
    # what a retry written after the cancel leaves: waiting, flagged
    await update_row(broker, msg_id, cancel_requested=1)
    await broker.start()
    row = await archived(broker, msg_id)
    await broker.stop()
    assert ran == [] and row["state"] == State.CANCELLED


async def test_a_saved_state_over_the_payload_limit_fails_the_run(db_url: str,
                                                                 prefix: str) -> None:
    broker = Broker(db_url, table_prefix=prefix, max_payload_bytes=1000)
    await broker.migrate()
    try:
        @broker.subscriber("jobs", retry=Retry.none(), **QUICK)
        async def step(msg: Message) -> None:
            await msg.defer(state="x" * 2000)

        msg_id = await broker.publish("jobs", "x")
        await broker.start()
        row = await archived(broker, msg_id)
        await broker.stop()
        assert row["state"] == State.FAILED and "over the limit of 1000" in row["error"]
    finally:
        await broker.close()
        drop_tables(db_url, prefix)
