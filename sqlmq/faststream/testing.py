""":class:`TestSqlmqBroker`: unit tests of an sqlmq FastStream app, in FastStream's testing
style, with no database.

Inside ``async with TestSqlmqBroker(broker)``, a publish runs the handlers of its queue at
once, in the publishing task (FastStream's fake producer): ``await broker.publish(...)``
returns after they ran, a handler's exception reaches the test, and ``handler.mock`` and
the publishers' mocks record the calls. Each handler gets an :class:`sqlmq.Message` of its
own (first delivery, no lease), so ``msg.ack()``, ``nack()``, ``reject()``, ``defer()`` and
``raw_message`` work as in production; what they decided is on ``msg.raw_message.decision``.
A ``publish_to`` step's return value is published onward the same way, and ``request``
answers with what a subscriber with ``results=True`` returned. Delays, priorities,
channels and the caller's transaction do not apply: nothing is stored. With
``with_real=True`` the broker runs for real on its database instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterable
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from faststream._internal.testing.broker import TestBroker, change_producer

from sqlmq import Message, NoResult
from sqlmq.codec import CONTENT_TYPE, encode
from sqlmq.records import Delivery

from .broker import SqlmqBroker
from .message import CORRELATION_ID, Reply
from .producer import SqlmqProducer, SqlmqPublishCommand
from .publisher import SqlmqPublisher
from .subscriber import SqlmqSubscriber

#: The queue of a fake subscriber for a publisher that names none (each call names it).
ANY_QUEUE = "*"


class TestSqlmqBroker(TestBroker[SqlmqBroker, Any], broker=SqlmqBroker):
    """Patch an :class:`~sqlmq.faststream.SqlmqBroker` (or several) for unit tests: no
    database, handlers run inline when a message is published."""

    @contextmanager
    def _patch_producer(self, broker: SqlmqBroker) -> Generator[None, None, None]:
        fake = FakeProducer(broker, self.brokers)
        with change_producer(broker.config.broker_config, fake):
            yield

    def create_publisher_fake_subscriber(
            self, broker: SqlmqBroker, publisher: SqlmqPublisher) -> tuple[SqlmqSubscriber, bool]:
        queue = publisher.queue or ANY_QUEUE
        for sub in (s for b in self.brokers for s in b.subscribers):
            if isinstance(sub, SqlmqSubscriber) and queue in sub.queues:
                return sub, True
        return broker.subscriber(queue, persistent=False), False

    @staticmethod
    async def _fake_connect(broker: SqlmqBroker, *args: Any, **kwargs: Any) -> Any:
        return broker.core


class FakeProducer(SqlmqProducer):
    """Runs the handlers of a published message's queue at once, instead of storing it."""

    _ids = itertools.count(1)

    def __init__(self, broker: SqlmqBroker, brokers: Iterable[SqlmqBroker]) -> None:
        config = broker.config.broker_config
        super().__init__(config, broker._parser, broker._decoder)
        self.brokers = tuple(brokers)
        self.connect(config.fd_config._serializer, config.broker_codec)

    def _subscribers(self, queue: str) -> list[SqlmqSubscriber]:
        return [s for b in self.brokers for s in b.subscribers
                if isinstance(s, SqlmqSubscriber) and queue in s.queues]

    async def publish_batch(self, cmd: SqlmqPublishCommand) -> list[int]:
        ids = []
        for body in cmd.batch_bodies:
            payload, content_type = await self.codec.encode(body, self.serializer)
            ids.append(await self._deliver(cmd.destination, payload,
                                           cmd.headers_for(content_type), cmd.priority,
                                           cmd.channel))
        return ids

    async def request(self, cmd: SqlmqPublishCommand) -> Reply:
        """Run the handlers of the queue at once, as a publish does, and answer with what
        the one that keeps its results (``results=True``) returned."""
        payload, content_type = await self.codec.encode(cmd.body, self.serializer)
        kept: list[Any] = []
        msg_id = await self._deliver(cmd.destination, payload, cmd.headers_for(content_type),
                                     cmd.priority, cmd.channel, kept)
        if not kept:
            raise NoResult(f"no subscriber of queue {cmd.destination!r} keeps its results "
                           "(results=True)", msg_id, None)
        body, kind = encode(kept[0])
        return Reply(cmd.destination, {CONTENT_TYPE: kind,
                                       CORRELATION_ID: cmd.correlation_id or ""}, body, msg_id)

    async def _deliver(self, queue: str, payload: bytes, headers: dict[str, str],
                       priority: int = 0, channel: str | None = None,
                       kept: list[Any] | None = None) -> int:
        """Run the handlers of ``queue``; ``kept`` gets the return values of those that
        keep their results."""
        msg_id = next(self._ids)
        for sub in self._subscribers(queue):
            result = await sub.process_message(Message(fake_delivery(
                msg_id, queue, payload, headers, priority, channel)))
            if kept is not None and sub.config.options.get("results"):
                kept.append(result.body)
            onward = sub.config.options.get("publish_to")
            if onward is not None and result.body is not None:
                payload, content_type = await self.codec.encode(result.body, self.serializer)
                await self._deliver(onward, payload, {"content-type": content_type}
                                    if content_type else {})
        return msg_id


def fake_delivery(msg_id: int, queue: str, payload: bytes, headers: dict[str, str],
                  priority: int = 0, channel: str | None = None) -> Delivery:
    """A first delivery of a message that was never stored."""
    now = datetime.now(UTC)
    return Delivery(id=msg_id, queue=queue, headers=headers, payload=payload, attempts=0,
                    deliveries=1, created_at=now, first_attempt_at=None, acquired_at=now,
                    lease_expires_at=now + timedelta(seconds=30), scheduled_at=None,
                    priority=priority, channel=channel)
