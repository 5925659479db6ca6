"""The relay: an sqlmq subscriber decorated with another FastStream broker's publisher
(``@rabbit.publisher("x") @sqlmq.subscriber("orders")``), both brokers in one FastStream app.
The handler's return value is published to the real RabbitMQ, NATS or Redis server before
its sqlmq message is acknowledged; a failed far publish leaves the message to its retries."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from faststream import Context, FastStream, Response

from sqlmq import Retry
from sqlmq.faststream import SqlmqBroker, SqlmqMessage

from ..conftest import drop_tables, rows, wait_until

SERVERS = {"rabbit": ("127.0.0.1", 5672), "nats": ("127.0.0.1", 4222),
           "redis": ("127.0.0.1", 6379)}


def far_broker(kind: str) -> Any:
    host, port = SERVERS[kind]
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:  # this machine and CI's run them: a missing one is a failure
        pytest.fail(f"no {kind} server on {host}:{port} ({exc}); the relay tests need it "
                    f"running")
    if kind == "rabbit":
        from faststream.rabbit import RabbitBroker

        return RabbitBroker(f"amqp://guest:guest@{host}:{port}/")
    if kind == "nats":
        from faststream.nats import NatsBroker

        return NatsBroker(f"nats://{host}:{port}")
    from faststream.redis import RedisBroker

    return RedisBroker(f"redis://{host}:{port}")


@pytest.mark.parametrize("kind", ["rabbit", "nats", "redis"])
async def test_a_sqlmq_subscriber_relays_to_a_real_broker(kind: str, db_url: str,
                                                          prefix: str) -> None:
    sq = SqlmqBroker(db_url, table_prefix=prefix, migrate=True)
    far = far_broker(kind)
    subject = f"relay-{prefix}"  # the far side's queue (subject, channel) of this test
    received: list[tuple[Any, str]] = []

    @far.subscriber(subject)
    async def far_side(body: dict, msg: Any = Context("message")) -> None:
        received.append((body, msg.headers.get("x-sqlmq-id")))

    @far.publisher(subject)
    @sq.subscriber("orders", retry=Retry.constant(0.1, max_attempts=3))
    async def relay(order: dict, msg: SqlmqMessage) -> Response:
        # sqlmq's id travels as the far side's deduplication key
        return Response({**order, "relayed": True}, headers={"x-sqlmq-id": msg.message_id})

    app = FastStream(sq, far)
    await app.start()
    try:
        ids = [await sq.publish({"id": i}, "orders") for i in range(3)]
        await wait_until(lambda: len(received) == 3, message=f"three messages on {kind}")
        assert sorted(received, key=lambda r: r[0]["id"]) == [
            ({"id": i, "relayed": True}, str(ids[i])) for i in range(3)]

        async def acked() -> bool:
            done = await rows(sq.core, "archive", queue="orders", state="COMPLETED")
            return len(done) == 3

        await wait_until(acked, message="the relayed messages archived COMPLETED")
    finally:
        await app.stop()
        drop_tables(db_url, prefix)


async def test_a_failed_far_publish_is_retried_not_lost(db_url: str, prefix: str) -> None:
    """The far publish is part of the handler: when it fails, sqlmq's retry strategy
    decides, and the message stays in the database until it has been relayed."""
    sq = SqlmqBroker(db_url, table_prefix=prefix, migrate=True)
    far = far_broker("nats")
    calls: list[int] = []

    @far.publisher(f"never-{prefix}")
    @sq.subscriber("orders", retry=Retry.constant(0.05, max_attempts=2))
    async def relay(order: dict) -> dict:
        calls.append(order["id"])
        return order

    await sq.start()  # the far broker is never connected: its publish fails
    try:
        await sq.publish({"id": 1}, "orders")

        async def failed() -> bool:
            return len(await rows(sq.core, "archive", queue="orders", state="FAILED")) == 1

        await wait_until(failed, message="the unrelayable message dead-lettered")
        (row,) = await rows(sq.core, "archive", queue="orders")
        assert calls == [1, 1] and row["attempts_count"] == 2
    finally:
        await sq.stop()
        drop_tables(db_url, prefix)


def _durable_pair(kind: str, name: str) -> tuple[Any, Any, Any]:
    """A far broker, and the decorators of a publisher that waits for the far broker's
    confirmation and of a subscriber reading it back: a JetStream stream (PubAck), a Redis
    stream (XADD's reply) or an MQTT topic at QoS 1 (PUBACK)."""
    if kind == "jetstream":
        from faststream.nats import JStream

        far = far_broker("nats")
        stream = JStream(name, subjects=[name])
        return far, far.publisher(name, stream=stream), far.subscriber(
            name, stream=stream, durable=name)
    if kind == "redis-stream":
        from faststream.redis import StreamSub

        far = far_broker("redis")
        # from the stream's start: a reader from "$" (the default) misses what is added
        # before its first XREAD, which a loaded machine delays past the first relay
        return far, far.publisher(stream=name), far.subscriber(
            stream=StreamSub(name, last_id="0-0"))
    from faststream.mqtt import MQTTBroker
    from zmqtt import QoS

    try:
        socket.create_connection(("127.0.0.1", 1883), timeout=2).close()
    except OSError as exc:
        pytest.fail(f"no MQTT server on 127.0.0.1:1883 ({exc}); the relay tests need it")
    far = MQTTBroker("mqtt://127.0.0.1:1883")
    return far, far.publisher(name, qos=QoS.AT_LEAST_ONCE), far.subscriber(
        name, qos=QoS.AT_LEAST_ONCE)


@pytest.mark.parametrize("kind", ["jetstream", "redis-stream", "mqtt"])
async def test_the_seeds_relay_pattern_reaches_streams_and_mqtt(kind: str, db_url: str,
                                                                prefix: str) -> None:
    """faststream-sqlbroker's relay as its README writes it, an sqlmq subscriber decorated
    with a far broker's publisher, to JetStream, a Redis stream and MQTT at QoS 1: each
    message arrives with sqlmq's id, and is archived COMPLETED once the far broker took
    it."""
    sq = SqlmqBroker(db_url, table_prefix=prefix, migrate=True)
    name = f"relay-{prefix.rstrip('_')}"
    far, publisher, subscriber = _durable_pair(kind, name)
    received: list[tuple[Any, str]] = []

    @subscriber
    async def far_side(body: dict, msg: Any = Context("message")) -> None:
        received.append((body, msg.headers.get("x-sqlmq-id")))

    @publisher
    @sq.subscriber("orders", retry=Retry.constant(0.1, max_attempts=3))
    async def relay(order: dict, msg: SqlmqMessage) -> Response:
        return Response(order, headers={"x-sqlmq-id": msg.message_id})

    app = FastStream(sq, far)
    await app.start()
    try:
        ids = [await sq.publish({"id": i}, "orders") for i in range(5)]
        await wait_until(lambda: len(received) >= 5, message=f"five messages on {kind}")
        assert sorted(received, key=lambda r: r[0]["id"]) == [
            ({"id": i}, str(ids[i])) for i in range(5)]

        async def archived() -> bool:
            done = await rows(sq.core, "archive", queue="orders", state="COMPLETED")
            return len(done) == 5

        await wait_until(archived, message="the relayed messages archived COMPLETED")
    finally:
        await app.stop()
        await _remove_stream(kind, name)
        drop_tables(db_url, prefix)


async def _remove_stream(kind: str, name: str) -> None:
    if kind == "jetstream":
        import nats

        nc = await nats.connect("nats://127.0.0.1:4222")
        try:
            await nc.jetstream().delete_stream(name)
        finally:
            await nc.close()
    elif kind == "redis-stream":
        import redis.asyncio as redis

        client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        try:
            await client.delete(name)
        finally:
            await client.aclose()


async def test_the_seeds_relay_pattern_to_kafka_through_its_test_client(
    db_url: str, prefix: str,
) -> None:
    """Kafka through FastStream's ``TestKafkaBroker``, an in-memory stand-in: no Kafka
    server runs on the machines sqlmq is tested on, so this checks what reaches FastStream's
    Kafka publisher (body, sqlmq's id in a header, the key), not a real Kafka's acks."""
    from faststream.kafka import KafkaBroker, KafkaResponse, TestKafkaBroker

    sq = SqlmqBroker(db_url, table_prefix=prefix, migrate=True)
    kafka = KafkaBroker("127.0.0.1:9092")
    received: list[tuple[Any, str, bytes]] = []

    @kafka.subscriber("invoices")
    async def far_side(body: dict, msg: Any = Context("message")) -> None:
        received.append((body, msg.headers.get("x-sqlmq-id"), msg.raw_message.key))

    @kafka.publisher("invoices")
    @sq.subscriber("orders")
    async def relay(order: dict, msg: SqlmqMessage) -> KafkaResponse:
        return KafkaResponse(order, headers={"x-sqlmq-id": msg.message_id},
                             key=str(order["id"]).encode())

    async with TestKafkaBroker(kafka):
        await sq.start()
        try:
            msg_id = await sq.publish({"id": 7}, "orders")
            await wait_until(lambda: len(received) == 1, message="the message in Kafka")
            assert received == [({"id": 7}, str(msg_id), b"7")]
        finally:
            await sq.stop()
            drop_tables(db_url, prefix)
