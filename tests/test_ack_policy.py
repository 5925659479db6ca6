"""What a handler's return or exception means under each AckPolicy, and settling by hand
with ``msg.ack()``, ``msg.nack(delay=…)`` and ``msg.reject(reason)``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlmq import AckPolicy, AlreadySettled, Broker, Message, Retry

from .conftest import on_every_engine, rows, wait_until

pytestmark = on_every_engine

FAST = {"flush_interval": 0.01, "max_fetch_interval": 0.05}
# A retry far away: a nacked message stays RETRYABLE where the test can look at it.
LATER = Retry.constant(60)


async def run_until_settled(broker: Broker, ids: list[int]) -> dict[int, Any]:
    """Run the broker until every message in ``ids`` is archived or RETRYABLE; return the
    rows by id (archive rows for archived messages)."""
    found: dict[int, Any] = {}

    async def settled() -> bool:
        found.clear()
        found.update({r["id"]: r for r in await rows(broker) if r["state"] == "RETRYABLE"})
        found.update({r["id"]: r for r in await rows(broker, "archive")})
        return all(i in found for i in ids)

    await broker.start()
    try:
        await wait_until(settled, message=f"messages {ids} settled")
    finally:
        await broker.stop()
    return found


async def test_ack_policy_completes_a_failed_handler_and_records_the_error(
    broker: Broker,
) -> None:
    calls: list[int] = []

    @broker.subscriber("q", ack_policy=AckPolicy.ACK, retry=LATER, **FAST)
    async def handle(msg: Message) -> None:
        calls.append(msg.id)
        raise ValueError("boom")

    msg_id = await broker.publish("q", "x")
    row = (await run_until_settled(broker, [msg_id]))[msg_id]

    assert calls == [msg_id]
    assert row["state"] == "COMPLETED"
    assert _first_line(row["error"]) == "ValueError: boom"
    assert row["attempts_count"] == 1


async def test_nack_on_error_is_the_default_and_retries_a_failed_handler(
    broker: Broker,
) -> None:
    @broker.subscriber("q", retry=LATER, **FAST)
    async def handle(body: str) -> None:
        if body == "bad":
            raise ValueError("boom")

    assert broker.subscribers[0].config.ack_policy is AckPolicy.NACK_ON_ERROR
    bad, good = await broker.publish("q", "bad"), await broker.publish("q", "good")
    found = await run_until_settled(broker, [bad, good])

    assert found[bad]["state"] == "RETRYABLE"
    assert _first_line(found[bad]["last_error"]) == "ValueError: boom"
    assert found[bad]["attempts_count"] == 1
    assert found[good]["state"] == "COMPLETED"


async def test_reject_on_error_fails_a_failed_handler_at_once(broker: Broker) -> None:
    calls: list[str] = []

    @broker.subscriber("q", ack_policy="REJECT_ON_ERROR", retry=Retry.constant(0.01), **FAST)
    async def handle(body: str) -> None:
        calls.append(body)
        if body == "bad":
            raise ValueError("boom")

    bad, good = await broker.publish("q", "bad"), await broker.publish("q", "good")
    found = await run_until_settled(broker, [bad, good])

    assert sorted(calls) == ["bad", "good"]  # no retry although the strategy allowed one
    assert found[bad]["state"] == "FAILED"
    assert _first_line(found[bad]["error"]) == "ValueError: boom"
    assert found[bad]["attempts_count"] == 1
    assert found[good]["state"] == "COMPLETED"


async def test_manual_policy_settles_only_by_hand_and_treats_anything_else_as_nack(
    broker: Broker,
) -> None:
    @broker.subscriber("q", ack_policy=AckPolicy.MANUAL, retry=LATER, **FAST)
    async def handle(msg: Message) -> None:
        action = msg.body
        if action == "ack":
            await msg.ack()
        elif action == "nack":
            await msg.nack()
        elif action == "reject":
            await msg.reject("not for us")
        elif action == "raise":
            raise ValueError("boom")
        # "return": neither settled nor raised

    ids = {a: await broker.publish("q", a) for a in ("ack", "nack", "reject", "return", "raise")}
    found = await run_until_settled(broker, list(ids.values()))

    assert found[ids["ack"]]["state"] == "COMPLETED"
    assert found[ids["ack"]]["error"] is None
    assert found[ids["nack"]]["state"] == "RETRYABLE"
    assert found[ids["nack"]]["last_error"] == "nacked"
    assert found[ids["reject"]]["state"] == "FAILED"
    assert found[ids["reject"]]["error"] == "not for us"
    assert found[ids["return"]]["state"] == "RETRYABLE"
    assert found[ids["return"]]["last_error"] == "returned without ack/nack/reject (MANUAL)"
    assert found[ids["raise"]]["state"] == "RETRYABLE"
    assert _first_line(found[ids["raise"]]["last_error"]) == "ValueError: boom"
    for action in ("nack", "return", "raise"):
        assert found[ids[action]]["attempts_count"] == 1


async def test_manual_nack_delay_overrides_the_strategy_delay(broker: Broker) -> None:
    @broker.subscriber("q", retry=Retry.constant(1), **FAST)
    async def handle(msg: Message) -> None:
        if msg.body == "seconds":
            await msg.nack(delay=30)
        else:
            await msg.nack(delay=timedelta(minutes=2))

    seconds, td = await broker.publish("q", "seconds"), await broker.publish("q", "timedelta")
    found = await run_until_settled(broker, [seconds, td])

    for msg_id, delay in ((seconds, 30), (td, 120)):
        row = found[msg_id]
        assert row["state"] == "RETRYABLE"
        gap = (row["next_attempt_at"] - row["last_attempt_at"]).total_seconds()
        assert abs(gap - delay) < 0.01


async def test_manual_nack_without_retries_left_archives_failed(broker: Broker) -> None:
    @broker.subscriber("q", retry=Retry.none(), **FAST)
    async def handle(msg: Message) -> None:
        await msg.nack(delay=5)

    msg_id = await broker.publish("q", "x")
    row = (await run_until_settled(broker, [msg_id]))[msg_id]

    assert row["state"] == "FAILED"
    assert row["error"] == "retries exhausted after 1 attempt(s): nacked"


async def test_manual_settlement_stands_when_the_handler_raises_afterwards(
    broker: Broker,
) -> None:
    @broker.subscriber("q", retry=LATER, **FAST)
    async def handle(msg: Message) -> None:
        if msg.body == "ack":
            await msg.ack()
        else:
            await msg.reject("bad input")
        raise ValueError("after settling")

    acked, rejected = await broker.publish("q", "ack"), await broker.publish("q", "reject")
    found = await run_until_settled(broker, [acked, rejected])

    assert found[acked]["state"] == "COMPLETED"
    assert _first_line(found[acked]["error"]) == "ValueError: after settling"
    assert found[rejected]["state"] == "FAILED"
    assert found[rejected]["error"] == "bad input"


async def test_settling_twice_raises_already_settled_and_the_first_decision_stands(
    broker: Broker,
) -> None:
    second_tries: list[str] = []

    @broker.subscriber("q", retry=LATER, **FAST)
    async def handle(msg: Message) -> None:
        await msg.ack()
        # They raise when called (the decision is recorded then), before any await.
        for again in (msg.ack, msg.nack, lambda: msg.reject("too late")):
            try:
                await again()
            except AlreadySettled as exc:
                second_tries.append(str(exc))

    msg_id = await broker.publish("q", "x")
    row = (await run_until_settled(broker, [msg_id]))[msg_id]

    assert second_tries == [f"message {msg_id} was already acked in this delivery"] * 3
    assert row["state"] == "COMPLETED"
    assert row["error"] is None


async def test_out_of_range_nack_delay_is_refused_without_settling(broker: Broker) -> None:
    refused: list[str] = []

    @broker.subscriber("q", retry=LATER, **FAST)
    async def handle(msg: Message) -> None:
        for delay in (-1, 1e13, float("nan")):
            try:
                await msg.nack(delay=delay)
            except ValueError as exc:
                refused.append(str(exc))
        await msg.reject("refused")

    msg_id = await broker.publish("q", "x")
    row = (await run_until_settled(broker, [msg_id]))[msg_id]

    assert refused == ["nack delay must not be negative, got -1",
                       f"nack delay of {1e13}s is over the limit of 3153600000s",
                       "nack delay of nans is over the limit of 3153600000s"]
    assert row["state"] == "FAILED"
    assert row["error"] == "refused"


async def test_a_sync_handler_settles_its_message_by_hand(broker: Broker) -> None:
    """In a sync handler (run in a thread) ``msg.ack()`` and the others work unawaited."""

    @broker.subscriber("q", ack_policy=AckPolicy.MANUAL, retry=LATER, **FAST)
    def handle(msg: Message) -> None:
        if msg.body == "ack":
            msg.ack()
        elif msg.body == "reject":
            msg.reject("not for us")
        else:
            msg.nack(delay=timedelta(hours=1))

    ids = {body: await broker.publish("q", body) for body in ("ack", "reject", "nack")}
    found = await run_until_settled(broker, list(ids.values()))

    assert found[ids["ack"]]["state"] == "COMPLETED"
    assert (found[ids["reject"]]["state"], found[ids["reject"]]["error"]) == (
        "FAILED", "not for us")
    nacked = found[ids["nack"]]
    assert (nacked["state"], nacked["last_error"]) == ("RETRYABLE", "nacked")


def _first_line(error: str) -> str:
    """The error without the handler's traceback, which follows it after a blank line."""
    return error.split("\n\n", 1)[0]
