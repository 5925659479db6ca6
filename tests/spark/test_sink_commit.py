"""The sink's staging and commit, without a Spark job: what executors stage (binary COPY on
PostgreSQL) is published unchanged, a commit that finds fewer staged rows than the
tasks reported publishes nothing, and a commit wakes subscribers as any publish does."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pyarrow as pa
import pytest
from sqlalchemy import delete, func, select

from sqlmq import Broker, Message
from sqlmq.errors import PublishError
from sqlmq.spark.options import Database
from sqlmq.spark.sink import SinkOptions, publish, stage

from ..conftest import rows, wait_until

pytestmark = pytest.mark.spark


def _options(opts: dict[str, str]) -> SinkOptions:
    return SinkOptions(db=Database(opts["url"], opts["prefix"]), queue="orders",
                       columns=("payload", "queue", "headers", "delay"),
                       content_type="application/octet-stream", max_payload_bytes=1 << 20,
                       sink=None)


def _batch(payloads: list[bytes], **columns: Any) -> Any:
    n = len(payloads)
    return pa.record_batch({
        "payload": pa.array(payloads, pa.binary()),
        "queue": pa.array(columns.get("queues", [None] * n), pa.string()),
        "headers": pa.array(columns.get("headers", [None] * n),
                            pa.map_(pa.string(), pa.string())),
        "delay": pa.array(columns.get("delays", [None] * n), pa.float64()),
    })


async def test_staged_rows_are_published_byte_for_byte_in_order(
    broker: Broker, opts: dict[str, str]
) -> None:
    o = _options(opts)
    token = uuid.uuid4().hex
    payloads = [bytes(range(256)), b"", "héllo\t\n\\x".encode(), *(b"%d" % i for i in range(50))]
    first = stage(o, token, iter([_batch(
        payloads[:3], queues=["orders", "äudit\tq", None],
        headers=[[("tenant", "a\tb\n\\")], None, [("content-type", "text/plain")]],
        delays=[0.0, 3600.5, None])]))
    second = stage(o, token, iter([_batch(payloads[3:])]))
    assert publish(o.db, [first, second], {token}) == len(payloads)

    live = await rows(broker)
    assert [r["payload"] for r in live] == payloads
    a, b, c = live[:3]
    assert [a["queue"], b["queue"], c["queue"]] == ["orders", "äudit\tq", "orders"]
    assert a["headers"] == {"tenant": "a\tb\n\\", "content-type": "application/octet-stream"}
    assert c["headers"] == {"content-type": "text/plain"}
    assert a["next_attempt_at"] == a["created_at"]
    delayed = (b["next_attempt_at"] - b["created_at"]).total_seconds()
    assert delayed == pytest.approx(3600.5, abs=1e-3)
    st = broker.schema.spark_staging
    async with broker.db.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(st))).scalar() == 0


async def test_a_commit_missing_staged_rows_publishes_nothing(
    broker: Broker, opts: dict[str, str]
) -> None:
    o = _options(opts)
    token = uuid.uuid4().hex
    staged = [stage(o, token, iter([_batch([b"%d" % i for i in range(k * 10, k * 10 + 10)])]))
              for k in range(2)]
    st = broker.schema.spark_staging
    async with broker.db.begin() as conn:  # e.g. an unlogged table emptied by a crash
        await conn.execute(delete(st).where(st.c.attempt == staged[1].attempt))
    with pytest.raises(PublishError, match="staged 20 rows but 10"):
        publish(o.db, list(staged), {token})
    assert await rows(broker) == []


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_a_sink_commit_wakes_an_idle_subscriber_with_its_notify(
    broker: Broker, opts: dict[str, str]
) -> None:
    """The sink's commit sends the NOTIFY every publish sends, with its transaction: a
    subscriber backed off to long polls (its next poll seconds away, as in
    tests/test_wakeups.py) gets the message at once, not at its next poll."""
    handled: list[bytes] = []

    @broker.subscriber("orders", max_fetch_interval=30.0)
    async def handle(msg: Message) -> None:
        handled.append(msg.payload)

    o = _options(opts)
    token = uuid.uuid4().hex
    staged = await asyncio.to_thread(stage, o, token, iter([_batch([b"woken"])]))
    await broker.start()
    await asyncio.sleep(6.0)  # idle: the next poll is about 10 s after the start

    assert await asyncio.to_thread(publish, o.db, [staged], {token}) == 1
    await wait_until(lambda: handled == [b"woken"], timeout=3.0,
                     message="the delivery woken by the sink's NOTIFY")
