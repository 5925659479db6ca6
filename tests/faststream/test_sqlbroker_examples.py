"""faststream-sqlbroker's documented examples (its tutorial's subscribe, acknowledgements,
publish and transactional outbox), with ``SqlBroker`` and ``SqlBrokerMessage`` imported from
sqlmq and sqlmq's ``Retry`` for its retry strategy classes: the changes docs/faststream.md
lists. Also: reply_to answers and ``SqlmqResponse`` options."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from faststream import AckPolicy, FastStream
from sqlalchemy.ext.asyncio import create_async_engine

from sqlmq import Retry
from sqlmq.connect import parse_url
from sqlmq.faststream import SqlmqBroker as SqlBroker
from sqlmq.faststream import SqlmqMessage as SqlBrokerMessage
from sqlmq.faststream import SqlmqResponse

from ..conftest import drop_tables, rows, wait_until


async def test_the_tutorials_examples_run_with_a_changed_import(db_url: str,
                                                                prefix: str) -> None:
    engine = create_async_engine(parse_url(db_url))
    broker = SqlBroker(engine=engine, table_prefix=prefix, migrate=True)
    app = FastStream(broker)
    seen: list[Any] = []

    @broker.subscriber(  # subscribe.py, as printed but for the retry strategy
        queues=["my_queue"], max_workers=10,
        retry_strategy=Retry.constant(5, max_attempts=3), min_fetch_interval=0.1,
        max_fetch_interval=1, fetch_batch_size=10, overfetch_factor=2, flush_interval=1,
        release_stuck_interval=60, release_stuck_timeout=60 * 5, max_deliveries=10,
        ack_policy=AckPolicy.NACK_ON_ERROR, retain_in_archive_on_ack=True,
        retain_in_archive_on_reject=True)
    async def handler(msg: str) -> None:
        seen.append(msg)

    @broker.subscriber(  # acknowledgements.py's manual handler
        queues=["manual_queue"], ack_policy=AckPolicy.MANUAL, max_fetch_interval=1.0,
        min_fetch_interval=0.1, fetch_batch_size=10, flush_interval=1.0)
    async def manual_handler(msg: SqlBrokerMessage, body: str) -> None:
        await msg.ack()
        seen.append(("manual", body))

    publisher_sqlbroker = broker.publisher()

    @app.after_startup  # publish.py
    async def publish_examples() -> None:
        await publisher_sqlbroker.publish("Hello, SqlBroker!", queue="my_queue")
        await publisher_sqlbroker.publish(
            "Process me later", queue="my_queue",
            next_attempt_at=datetime.now(UTC) + timedelta(minutes=5))
        async with engine.begin() as connection:
            await publisher_sqlbroker.publish("Transactional message", queue="my_queue",
                                              connection=connection)
        await publisher_sqlbroker.publish("by hand", queue="manual_queue",
                                          headers={"x-test-header": "outbox"})

    await app.start()
    try:
        await wait_until(lambda: len(seen) == 3, message="three handled messages")
        assert sorted(map(str, seen)) == sorted(map(str, [
            "Hello, SqlBroker!", "Transactional message", ("manual", "by hand")]))
        async def left() -> list[Any]:  # the results are written each flush_interval
            return [r["payload"] for r in await rows(broker.core, "message", queue="my_queue")]

        await wait_until(lambda: _one(left()), message="only the delayed one left")
        assert await left() == [b"Process me later"]  # due in 5 minutes
    finally:
        await app.stop()
        await engine.dispose()
        drop_tables(db_url, prefix)


async def _one(found: Any) -> bool:
    return len(await found) == 1


async def test_reply_to_and_response_options() -> None:
    broker = SqlBroker("memory://")
    answers: list[Any] = []

    @broker.subscriber("questions")
    async def answer(question: str) -> str:
        return question.upper()

    @broker.subscriber("answers")
    async def collect(body: str, msg: SqlBrokerMessage) -> None:
        answers.append((body, msg.correlation_id))

    @broker.subscriber("orders")
    @broker.publisher("invoices")
    async def bill(order: dict) -> SqlmqResponse:
        return SqlmqResponse({"order": order["id"]}, priority=7, channel="tenant-1",
                             dedup_key=f"invoice-{order['id']}", delay=3600)

    await broker.start()
    try:
        await broker.publish("why?", "questions", reply_to="answers", correlation_id="q-1")
        await broker.publish({"id": 9}, "orders")
        await wait_until(lambda: answers == [("WHY?", "q-1")], message="the answer")

        async def invoiced() -> bool:
            return bool(await rows(broker.core, "message", queue="invoices"))

        await wait_until(invoiced, message="the invoice")
        (row,) = await rows(broker.core, "message", queue="invoices")
        assert (row["priority"], row["channel"], row["dedup_key"]) == \
            (7, "tenant-1", "invoice-9")
    finally:
        await broker.stop()
