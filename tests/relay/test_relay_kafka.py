"""The Kafka target through FastStream's ``TestKafkaBroker``, an in-memory Kafka: there is
no Kafka server on the development and CI machines, so this checks what the relay hands
FastStream's KafkaBroker (the body, the headers with the sqlmq id and publish time, the
channel as the key, the publish time as the timestamp), not Kafka's acknowledgements."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from faststream.kafka import KafkaMessage, TestKafkaBroker

from sqlmq import Broker, Relay
from sqlmq.relay.target import target_for

from ..conftest import drained, rows, wait_until


async def test_kafka_gets_each_message_with_its_id_time_and_channel_as_key(
        broker: Broker) -> None:
    target: Any = target_for("kafka://127.0.0.1:9092", {"topic": "orders-out"}, 10.0)
    got: list[KafkaMessage] = []

    @target.kafka.subscriber("orders-out")
    async def far_side(message: KafkaMessage) -> None:
        got.append(message)

    async with TestKafkaBroker(target.kafka):
        relay = Relay(broker, "outbox", to=target)
        await broker.set_channel("order-7", ordered=True)
        plain = await broker.publish_batch("outbox", [{"n": n} for n in range(50)])
        ordered = await broker.publish_batch("outbox", [{"step": n} for n in range(20)],
                                             channel="order-7")
        await broker.start()
        await wait_until(lambda: len(got) == 70, message="70 messages in Kafka")
        await wait_until(lambda: drained(broker, "outbox"), message="all archived")
        await broker.stop()
    assert relay.stats.sent == 70
    by_id = {int(m.headers["sqlmq-id"]): m for m in got}
    assert sorted(by_id) == sorted(plain + ordered)
    assert [int(m.headers["sqlmq-id"]) for m in got if m.raw_message.key] == ordered
    published = {r["id"]: r["created_at"] for r in await rows(broker, "archive")}
    for msg_id, m in by_id.items():
        when = published[msg_id]
        when = when.replace(tzinfo=UTC) if when.tzinfo is None else when
        assert datetime.fromisoformat(m.headers["sqlmq-published-at"]) == when
        assert m.raw_message.timestamp == int(when.timestamp() * 1000)
        assert m.headers["content-type"] == "application/json"
    assert got[-1].raw_message.key == b"order-7" and not got[0].raw_message.key
