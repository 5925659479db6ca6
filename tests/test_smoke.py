"""The shortest path through the lifecycle, on every database and the in-memory engine."""

from __future__ import annotations

from sqlmq import Broker, Message

from .conftest import drained, on_every_engine, rows, wait_until

pytestmark = on_every_engine


async def test_published_message_is_handled_and_archived_completed(broker: Broker) -> None:
    handled: list[Message] = []

    @broker.subscriber("orders", flush_interval=0.01)
    async def handle(msg: Message) -> None:
        handled.append(msg)

    msg_id = await broker.publish("orders", {"id": 7}, headers={"tenant": "a"})
    await broker.start()
    await wait_until(lambda: drained(broker, "orders"), message="queue drained")
    await broker.stop()

    assert [m.id for m in handled] == [msg_id]
    assert handled[0].body == {"id": 7}
    assert handled[0].headers["tenant"] == "a"
    (archived,) = await rows(broker, "archive")
    assert archived["id"] == msg_id
    assert archived["state"] == "COMPLETED"
    assert archived["deliveries_count"] == 1
    assert archived["attempts_count"] == 1
    assert archived["created_at"].tzinfo is not None
