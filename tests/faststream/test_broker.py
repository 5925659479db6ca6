"""SqlmqBroker on each database: FastStream handlers (annotation validation, Context,
Depends, Logger, publishers), FastStream's settles and ack policies as sqlmq's results,
the outbox in the caller's transaction, and FastStream middlewares around sqlmq's publishes
and deliveries."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from faststream import AckPolicy, Context, Depends, Logger
from faststream.exceptions import NackMessage
from faststream.middlewares import BaseMiddleware
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from sqlmq import Retry
from sqlmq.connect import parse_url
from sqlmq.faststream import SqlmqBroker, SqlmqMessage

from ..conftest import drop_tables, rows, wait_until


class Order(BaseModel):
    id: int
    total: float


@pytest.fixture
async def fs(db_url: str, prefix: str) -> AsyncIterator[SqlmqBroker]:
    broker = SqlmqBroker(db_url, table_prefix=prefix, migrate=True, graceful_timeout=5)
    try:
        yield broker
    finally:
        await broker.stop()
        drop_tables(db_url, prefix)


async def archived(broker: SqlmqBroker, count: int, **where: Any) -> list[Any]:
    """Wait until ``count`` archive rows match ``where``; return them."""
    found: list[Any] = []

    async def enough() -> bool:
        found[:] = await rows(broker.core, "archive", **where)
        return len(found) >= count

    await wait_until(enough, message=f"{count} archived rows {where}")
    return found


async def test_handlers_take_what_faststream_handlers_take(fs: SqlmqBroker) -> None:
    seen: list[Any] = []

    def tenant(msg: SqlmqMessage) -> str:
        return msg.headers.get("tenant", "?")

    @fs.subscriber("orders", workers=2, retry=Retry.constant(0.05, max_attempts=2))
    @fs.publisher("invoices")
    async def charge(order: Order, msg: SqlmqMessage, logger: Logger,
                     who: str = Depends(tenant), broker: Any = Context("broker")) -> dict:
        logger.info("charging %s", order.id)
        seen.append((order, who, broker is fs, msg.raw_message.id == msg.id, msg.attempts))
        return {"order": order.id, "due": order.total * 2}

    @fs.subscriber("invoices")
    async def invoice(body: dict, msg: SqlmqMessage) -> None:
        seen.append(("invoice", body, msg.correlation_id))

    await fs.start()
    await fs.publish({"id": 7, "total": 2.5}, "orders", headers={"tenant": "a"},
                     correlation_id="corr-1")
    await fs.publish({"id": "not a number"}, "orders")  # fails its annotation
    await archived(fs, 2, queue="orders")
    await archived(fs, 1, queue="invoices", state="COMPLETED")
    assert seen[0] == (Order(id=7, total=2.5), "a", True, True, 0)
    assert seen[1] == ("invoice", {"order": 7, "due": 5.0}, "corr-1")
    assert len(seen) == 2
    # the invalid body was nacked (NACK_ON_ERROR, the default): the retry strategy decided,
    # then the dead letters kept it with the validation error
    (bad,) = await rows(fs.core, "archive", queue="orders", state="FAILED")
    assert bad["attempts_count"] == 2 and "validation error" in bad["error"].lower()


async def test_settles_and_ack_policies_become_sqlmq_results(fs: SqlmqBroker) -> None:
    once = Retry.constant(0.05, max_attempts=2)

    @fs.subscriber("acked", ack_policy=AckPolicy.ACK)
    async def acked(body: str) -> None:
        raise RuntimeError("archived COMPLETED all the same")

    @fs.subscriber("rejected", ack_policy=AckPolicy.REJECT_ON_ERROR, retry=once)
    async def rejected(body: str) -> None:
        raise RuntimeError("rejected at once")

    @fs.subscriber("nacked", retry=once)  # NACK_ON_ERROR: the retry strategy decides
    async def nacked(body: str) -> None:
        raise RuntimeError("retried once")

    @fs.subscriber("manual", ack_policy=AckPolicy.MANUAL)
    async def manual(body: str, msg: SqlmqMessage) -> None:
        await (msg.reject("refused by hand") if body == "no" else msg.ack())

    @fs.subscriber("raised", retry=once)
    async def raised(body: str) -> None:
        raise NackMessage()

    @fs.subscriber("deferred")
    async def deferred(body: str, msg: SqlmqMessage) -> None:
        if msg.state is None:  # first delivery: save progress, come back (not an attempt)
            await msg.defer(state={"page": 1})

    await fs.start()
    for queue in ("acked", "rejected", "nacked", "raised", "deferred"):
        await fs.publish("x", queue)
    await fs.publish("no", "manual")
    await fs.publish("yes", "manual")

    (row,) = await archived(fs, 1, queue="acked")
    assert row["state"] == "COMPLETED" and "archived COMPLETED" in row["error"]
    (row,) = await archived(fs, 1, queue="rejected")
    assert (row["state"], row["attempts_count"]) == ("FAILED", 1)
    assert "rejected at once" in row["error"] and "Traceback" in row["error"]
    (row,) = await archived(fs, 1, queue="nacked")
    assert (row["state"], row["attempts_count"], row["deliveries_count"]) == ("FAILED", 2, 2)
    assert "retries exhausted" in row["error"] and "retried once" in row["error"]
    (row,) = await archived(fs, 1, queue="raised")
    assert (row["state"], row["attempts_count"]) == ("FAILED", 2)
    states = {json.loads(r["payload"]) if r["payload"].startswith(b"{") else r["payload"]:
              (r["state"], r["error"]) for r in await archived(fs, 2, queue="manual")}
    assert states == {b"no": ("FAILED", "refused by hand"), b"yes": ("COMPLETED", None)}
    (row,) = await archived(fs, 1, queue="deferred")
    assert (row["state"], row["attempts_count"], row["deliveries_count"]) == \
        ("COMPLETED", 1, 2)


async def test_the_outbox_commits_and_rolls_back_with_the_callers_session(
        fs: SqlmqBroker, db_url: str) -> None:
    engine = create_async_engine(parse_url(db_url))
    publisher = fs.publisher("orders")
    try:
        await fs.connect()
        async with AsyncSession(engine) as session:
            async with session.begin():
                await fs.publish({"id": 1}, "orders", connection=session)
                await publisher.publish({"id": 2}, connection=session, channel="tenant-1",
                                        priority=5, dedup_key="order-2")
                await session.rollback()  # the business transaction fails: no message
        assert await rows(fs.core, "message") == []
        async with AsyncSession(engine) as session, session.begin():
            await publisher.publish({"id": 3}, connection=session, channel="tenant-1",
                                    priority=5, dedup_key="order-3")
        (row,) = await rows(fs.core, "message")
        assert json.loads(row["payload"]) == {"id": 3}
        assert (row["channel"], row["priority"], row["dedup_key"]) == ("tenant-1", 5, "order-3")
        assert row["headers"]["content-type"] == "application/json"
    finally:
        await engine.dispose()


class Recorder(BaseMiddleware):
    """A FastStream middleware that records what it sees."""

    seen: list[tuple[str, Any]] = []

    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        Recorder.seen.append(("consume", msg.raw_message.queue))
        return await call_next(msg)

    async def publish_scope(self, call_next: Any, cmd: Any) -> Any:
        Recorder.seen.append(("publish", cmd.destination))
        return await call_next(cmd)


async def test_middlewares_see_publishes_and_deliveries(db_url: str, prefix: str) -> None:
    Recorder.seen = []
    fs = SqlmqBroker(db_url, table_prefix=prefix, migrate=True, middlewares=[Recorder])
    try:
        @fs.subscriber("in")
        @fs.publisher("out")
        async def step(body: int) -> int:
            return body + 1

        @fs.subscriber("out")
        async def last(body: int) -> None:
            pass

        await fs.start()
        await fs.publish(1, "in")
        await archived(fs, 1, queue="out")
        assert Recorder.seen == [("publish", "in"), ("consume", "in"), ("publish", "out"),
                                 ("consume", "out")]
    finally:
        await fs.stop()
        drop_tables(db_url, prefix)


async def test_request_answers_with_the_result_its_subscriber_keeps(fs: SqlmqBroker) -> None:
    """FastStream's ``request`` on sqlmq: the body encoded the FastStream way, the answer
    FastStream's response message, a failure sqlmq's error, no answer in time a
    TimeoutError; a publisher's ``request`` too."""
    from sqlmq import MessageFailed, ResultTimeout

    @fs.subscriber("quotes", results=True, retry=Retry.none())
    async def quote(order: Order) -> dict[str, float]:
        if order.total < 0:
            raise ValueError("a negative total")
        return {"id": order.id, "due": order.total * 1.2}

    await fs.start()
    response = await fs.request(Order(id=7, total=10), "quotes", timeout=20,
                                correlation_id="corr-7")
    assert await response.decode() == {"id": 7, "due": 12.0}
    assert json.loads(response.body) == {"id": 7, "due": 12.0}
    assert response.correlation_id == "corr-7"
    answer = await fs.publisher("quotes").request({"id": 8, "total": 5}, timeout=20)
    assert await answer.decode() == {"id": 8, "due": 6.0}
    with pytest.raises(MessageFailed, match="a negative total"):
        await fs.request({"id": 9, "total": -1}, "quotes", timeout=20)
    with pytest.raises(TimeoutError):
        await fs.request({"id": 1}, "nobody-answers", timeout=0.1)
    assert issubclass(ResultTimeout, TimeoutError)
    completed = await rows(fs.core, "archive", queue="quotes", state="COMPLETED")
    assert [r["headers"]["awaited"] for r in completed] == ["result", "result"]
