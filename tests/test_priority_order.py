"""A subscriber handles ready messages highest priority first (one worker, one message per
fetch), on every database and the in-memory engine; ``Message.priority`` shows it, and the
archive keeps it."""

from __future__ import annotations

from sqlmq import Broker, Message

from .conftest import drained, on_every_engine, rows, wait_until

pytestmark = on_every_engine


async def test_a_subscriber_handles_messages_in_priority_order(broker: Broker) -> None:
    handled: list[tuple[str, int]] = []

    @broker.subscriber("jobs", workers=1, fetch_batch=1, flush_interval=0.01)
    async def handle(msg: Message) -> None:
        handled.append((msg.body, msg.priority))

    await broker.publish_batch("jobs", ["low-1", "low-2"])
    await broker.publish("jobs", "urgent", priority=10)
    broker.publish_batch_sync("jobs", ["high-1", "high-2"], priority=5)
    broker.publish_sync("jobs", "background", priority=-1)
    await broker.publish("jobs", "low-3", priority=0)
    await broker.start()
    await wait_until(lambda: drained(broker, "jobs"), message="queue drained")
    await broker.stop()

    assert handled == [("urgent", 10), ("high-1", 5), ("high-2", 5), ("low-1", 0),
                       ("low-2", 0), ("low-3", 0), ("background", -1)]
    archived = {r["payload"]: r["priority"] for r in await rows(broker, "archive")}
    assert archived[b"urgent"] == 10 and archived[b"background"] == -1
