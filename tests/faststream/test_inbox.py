"""The inbox as a FastStream handler (:func:`sqlmq.faststream.inbox_handler`): a far
broker's FastStream subscriber (real RabbitMQ, NATS JetStream, Redis Streams) takes each
message into a sqlmq queue once, a message delivered again writes nothing, and a message it
cannot take is rejected, not lost silently. On the three databases; ``memory://`` is refused
(the ledger is a table)."""

from __future__ import annotations

import logging
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from faststream import Context, FastStream

from sqlmq import Broker, ConfigurationError, Message
from sqlmq.faststream import SqlmqBroker, inbox_handler

from ..conftest import drained, drop_tables, one_kill_test_at_a_time, rows, wait_until
from ..relay.inbox_sources import kill_while_taking
from .test_relay import far_broker

KINDS = ["rabbit", "nats", "redis"]


def _subscribe(far: Any, kind: str, name: str, handler: Any) -> None:
    """``handler`` on the far broker's queue (RabbitMQ), stream (JetStream, a stream made
    for the test) or Redis stream (a consumer group) ``name``."""
    if kind == "rabbit":
        far.subscriber(name)(handler)
    elif kind == "nats":
        from faststream.nats import JStream

        far.subscriber(name, stream=JStream(name, subjects=[name]), durable=name)(handler)
    else:
        from faststream.redis import StreamSub

        far.subscriber(stream=StreamSub(name, group="sqlmq", consumer="c1",
                                        last_id="0-0"))(handler)  # from the start


async def _publish(far: Any, kind: str, name: str, body: bytes, key: str) -> None:
    if kind == "rabbit":
        await far.publish(body, name, message_id=key, headers={"x-key": key})
    elif kind == "nats":
        await far.publish(body, name, stream=name, headers={"x-key": key})
    else:
        await far.publish(body, stream=name, headers={"x-key": key})


async def _cleanup(kind: str, name: str) -> None:
    """Delete the test's queue or stream, with the server's own client."""
    if kind == "rabbit":
        import aio_pika

        connection = await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/")
        async with connection:
            await (await connection.channel()).queue_delete(name)
    elif kind == "nats":
        import nats

        nc = await nats.connect("nats://127.0.0.1:4222")
        try:
            await nc.jetstream().delete_stream(name)
        finally:
            await nc.close()
    else:
        import redis.asyncio as redis

        client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        try:
            await client.delete(name)
        finally:
            await client.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_each_far_message_is_taken_once_though_delivered_again(
    kind: str, db_url: str, prefix: str,
) -> None:
    """Twenty messages, then the first ten again with the same keys (as a far broker
    delivers what it never heard acknowledged), then a last one: twenty-one sqlmq messages,
    each with its body, headers and key as ``dedup_key``, and a ledger row each."""
    sq = SqlmqBroker(db_url, table_prefix=prefix, migrate=True)
    far = far_broker(kind)
    name = f"inbox-{uuid.uuid4().hex[:10]}"
    # JetStream drops a second Nats-Msg-Id itself, and a Redis entry's id is new at each
    # XADD: the keys travel in a header there, to deliver a key twice
    key_header = None if kind == "rabbit" else "x-key"
    take = inbox_handler(sq, "orders", key_header=key_header)
    handled: list[int] = []

    async def counted(message: Any = Context("message")) -> None:
        await take(message)
        handled.append(1)

    _subscribe(far, kind, name, counted)
    app = FastStream(far, sq)
    await app.start()
    try:
        for i in range(20):
            await _publish(far, kind, name, b"order-%d" % i, f"k{i}")
        for i in range(10):
            await _publish(far, kind, name, b"again-%d" % i, f"k{i}")
        await _publish(far, kind, name, b"last", "last")

        async def taken() -> list[Any]:
            return await rows(sq.core, "message", queue="orders")

        # handled concurrently: the last may be in before the others are
        await wait_until(lambda: len(handled) == 31, timeout=60, message="31 deliveries")
        found = await taken()
        assert sorted(r["dedup_key"] for r in found) == sorted(
            [f"k{i}" for i in range(20)] + ["last"])
        assert {r["dedup_key"]: bytes(r["payload"]) for r in found}["k3"] == b"order-3"
        assert all(r["headers"]["x-key"] == r["dedup_key"] for r in found)
        async with sq.core.db.connect() as conn:
            t = sq.core.schema.inbox_seen
            ledger = (await conn.execute(t.select().where(
                t.c.source == "faststream:orders"))).all()
        assert len(ledger) == 21
    finally:
        await _cleanup(kind, name)
        await app.stop()
        drop_tables(db_url, prefix)


async def test_a_message_without_a_key_or_too_large_is_rejected_and_said(
    db_url: str, prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """RabbitMQ, keys in a header: a message without it is rejected (to its dead-letter
    exchange, where it has one), one over sqlmq's ``max_payload_bytes`` too, each with an
    error line naming why; the next good message is taken. (A message without an AMQP
    ``message_id`` cannot be made with aio-pika, which gives each one an id.)"""
    sq = SqlmqBroker(db_url, table_prefix=prefix, migrate=True, max_payload_bytes=1000)
    far = far_broker("rabbit")
    name = f"inbox-{uuid.uuid4().hex[:10]}"
    _subscribe(far, "rabbit", name, inbox_handler(sq, "orders", key_header="order-id"))
    app = FastStream(far, sq)
    await app.start()
    try:
        with caplog.at_level(logging.ERROR, logger="sqlmq"):
            await far.publish(b"no key", name)
            await far.publish(b"x" * 5000, name, headers={"order-id": "big"})
            await far.publish(b"fine", name, headers={"order-id": "fine"})

            async def refused_two() -> bool:
                return sum("refused" in r.getMessage() for r in caplog.records) == 2

            await wait_until(refused_two, timeout=60, message="two messages refused")
            await wait_until(lambda: _only(sq, "fine"), timeout=60,
                             message="the good message alone")
        said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert any("it has no key (no message id, and no order-id header)" in s
                   for s in said), said
        assert any("exceeds the broker's max_payload_bytes" in s for s in said), said
    finally:
        await _cleanup("rabbit", name)
        await app.stop()
        drop_tables(db_url, prefix)


async def _only(sq: SqlmqBroker, key: str) -> bool:
    return [r["dedup_key"] for r in await rows(sq.core, "message", queue="orders")] == [key]


async def test_the_inbox_handler_needs_a_database() -> None:
    handler = inbox_handler(Broker("memory://"), "orders", key=lambda message: "k1")

    class Delivered:  # what FastStream hands the handler, enough to reach the check
        committed = None
        body = b"x"
        headers: dict[str, str] = {}
        raw_message = None

    with pytest.raises(ConfigurationError, match="needs a database for its ledger"):
        await handler(Delivered())


APP = """
import asyncio, sys
from faststream import FastStream
from faststream.rabbit import RabbitBroker
from sqlmq.faststream import SqlmqBroker, inbox_handler

url, prefix, name = sys.argv[1:4]
rabbit = RabbitBroker("amqp://guest:guest@127.0.0.1:5672/")
sqlmq = SqlmqBroker(url, table_prefix=prefix)
rabbit.subscriber(name)(inbox_handler(sqlmq, "in"))
asyncio.run(FastStream(rabbit, sqlmq).run())
"""


@pytest.mark.slow
@one_kill_test_at_a_time
async def test_killed_inbox_handler_processes_take_each_message_once(
    broker: Broker, db_url: str, prefix: str, tmp_path: Path,
) -> None:
    """A FastStream app whose RabbitMQ subscriber is an inbox handler, SIGKILLed three
    times while it takes 600 messages: RabbitMQ delivers again what each held
    unacknowledged, and every message is in sqlmq once (live or archived: a subscriber of
    this test handles them meanwhile, so sqlmq's dedup key could not hide a second one)."""
    n, name = 600, f"inbox-{uuid.uuid4().hex[:10]}"
    bodies = [b"message %d" % i for i in range(n)]
    import aio_pika

    connection = await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/")
    channel = await connection.channel()
    await channel.declare_queue(name, durable=True)  # as FastStream declares it
    for i, body in enumerate(bodies):
        await channel.default_exchange.publish(aio_pika.Message(body, message_id=f"k{i}"),
                                               routing_key=name)

    @broker.subscriber("in", workers=4)
    async def handle(msg: Message) -> None:
        return None

    await broker.start()
    script = tmp_path / "app.py"
    script.write_text(APP)
    try:
        await kill_while_taking([sys.executable, str(script), db_url, prefix, name], broker,
                                n, 3, (80, 150), tmp_path / "app.log",
                                started="FastStream app started successfully")
        await wait_until(lambda: drained(broker, "in"), timeout=60, message="sqlmq drained")
    finally:
        await broker.stop()
        await channel.queue_delete(name)
        await connection.close()
    live = await rows(broker, "message", queue="in")
    archived = await rows(broker, "archive", queue="in")
    got = Counter(bytes(r["payload"]) for r in [*live, *archived])
    twice = {b: k for b, k in got.items() if k > 1}
    assert not twice, f"{len(twice)} far messages twice in sqlmq, e.g. {list(twice)[:3]}"
    assert sorted(got) == sorted(bodies), f"{n - len(got)} far messages lost"
