"""Pipelines end to end, on every database and the in-memory engine: a subscriber with
``publish_to`` publishes its handler's return value in the transaction that archives the
input (sqlmq.pipeline). The crash half (SIGKILL between the handler's return and the settle)
is tests/faults/test_pipeline_kill.py."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

from sqlmq import Broker, ConfigurationError, Message, Retry, State
from sqlmq.codec import CONTENT_TYPE, JSON_TYPE

from .conftest import drained, on_every_engine, rows, wait_until

pytestmark = on_every_engine


class Invoice(BaseModel):
    order: int
    total: float


async def _settled(broker: Broker, *queues: str) -> bool:
    for q in queues:
        if not await drained(broker, q):
            return False
    return True


async def test_a_steps_return_value_is_published_to_its_queue(broker: Broker) -> None:
    invoices: list[Invoice] = []

    @broker.subscriber("orders", publish_to="invoices", workers=4, flush_interval=0.01)
    async def bill(order: dict[str, Any]) -> Invoice | None:
        if order["total"] == 0:
            return None  # nothing to bill: a filter step publishes nothing
        return Invoice(order=order["id"], total=order["total"] * 1.2)

    @broker.subscriber("invoices", flush_interval=0.01)
    async def record(invoice: Invoice) -> None:
        invoices.append(invoice)

    await broker.start()
    await broker.publish_batch("orders", [{"id": i, "total": i % 5} for i in range(50)])
    await wait_until(lambda: _settled(broker, "orders", "invoices"), message="both drained")
    await broker.stop()

    assert sorted(i.order for i in invoices) == [i for i in range(50) if i % 5]
    assert all(i.total == pytest.approx((i.order % 5) * 1.2) for i in invoices)
    stats = {s.queue: s for s in await broker.stats()}
    assert (stats["orders"].completed, stats["invoices"].completed) == (50, 40)
    archived = await rows(broker, "archive", queue="invoices")
    assert {r["headers"][CONTENT_TYPE] for r in archived} == {JSON_TYPE}


async def test_only_a_completed_run_publishes(broker: Broker) -> None:
    runs: Counter[str] = Counter()

    @broker.subscriber("in", publish_to="out", flush_interval=0.01,
                       retry=Retry.exponential(0.01, max_attempts=3))
    async def step(msg: Message) -> str:
        runs[msg.body] += 1
        if msg.body == "flaky" and msg.attempts == 0:
            raise RuntimeError("first attempt fails")
        if msg.body == "rejected":
            await msg.reject("not ours")
        if msg.body == "acked":
            await msg.ack()
        return f"{msg.body}!"

    await broker.publish_batch("in", ["flaky", "rejected", "acked", "plain"])
    await broker.start()
    await wait_until(lambda: drained(broker, "in"), message="in drained")
    await broker.stop()

    assert runs == {"flaky": 2, "rejected": 1, "acked": 1, "plain": 1}
    published = sorted(r["payload"].decode() for r in await rows(broker, queue="out"))
    assert published == ["acked!", "flaky!", "plain!"]  # once each; the reject leaves none
    states = {r["payload"].decode(): r["state"] for r in await rows(broker, "archive")}
    assert states == {"flaky": State.COMPLETED, "rejected": State.FAILED,
                      "acked": State.COMPLETED, "plain": State.COMPLETED}


async def test_a_return_value_that_cannot_be_published_fails_the_step(broker: Broker) -> None:
    broker.max_payload_bytes = 64  # what the subscribers registered from here on are held to

    @broker.subscriber("in", publish_to="out", flush_interval=0.01, retry=Retry.none())
    async def step(body: str) -> Any:
        return object() if body == "object" else "x" * 100

    await broker.publish_batch("in", ["object", "large"])
    await broker.start()
    await wait_until(lambda: drained(broker, "in"), message="in drained")
    await broker.stop()

    assert await rows(broker, queue="out") == []
    errors = {r["payload"].decode(): r["error"].split("\n", 1)[0]
              for r in await rows(broker, "archive")}
    where = "PipelineError: handler test_a_return_value_that_cannot_be_published_fails_the_" \
            "step.<locals>.step returned a value that cannot be published to queue 'out': "
    assert errors["object"] == (f"retries exhausted after 1 attempt(s): {where}EncodeError: "
                                "cannot encode a body of type object: Object of type object "
                                "is not JSON serializable; pass bytes, str, a JSON-"
                                "serialisable value or a pydantic model")
    assert errors["large"] == (f"retries exhausted after 1 attempt(s): {where}PayloadTooLarge: "
                               "payload of 100 bytes for queue 'out' exceeds the broker's "
                               "max_payload_bytes (64)")


async def test_publish_to_is_checked_when_the_subscriber_is_registered(broker: Broker) -> None:
    with pytest.raises(ConfigurationError, match="publish_to: queue name must not be empty"):
        broker.subscriber("in", publish_to="")
    with pytest.raises(ConfigurationError, match="publish_to: queue name must be a str"):
        broker.subscriber("in", publish_to=7)  # type: ignore[arg-type]
