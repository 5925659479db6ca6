"""The inbox inside a FastStream app: a handler for a far broker's FastStream subscriber
(RabbitMQ, NATS JetStream, Redis Streams) that takes each of its messages into a sqlmq
queue exactly once, for apps that consume those brokers with FastStream already::

    rabbit = RabbitBroker("amqp://guest:guest@127.0.0.1:5672/")
    sqlmq = SqlmqBroker("postgresql://…")
    rabbit.subscriber("orders")(inbox_handler(sqlmq, "orders"))

It is :class:`sqlmq.Inbox`'s rule on FastStream's consume path: each delivery's key is
looked up in the inbox's ledger and, if new, the message is published into the sqlmq queue
with its ledger row in one transaction; only after the commit is it acknowledged to the far
broker. A crash between the two makes the far broker deliver it again, and the ledger
answers that it was taken: it is acknowledged, nothing is written.

The key is the far broker's own id for the message, read from the client's message (never
FastStream's ``message_id``, which is a fresh random id when the far message has none): the
AMQP ``message_id``, JetStream's ``Nats-Msg-Id`` header else the stream sequence, a Redis
stream entry's id; or the value of ``key_header``; or what ``key(message)`` returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from faststream import Context

from ..backoff import Backoff
from ..errors import ConfigurationError, PublishError
from ..relay.inbox import DEFAULT_RETENTION, fitted_key, inbox_retention
from ..relay.ledger import Ledger
from ..relay.source import FarMessage, text_headers
from ..subscriber import check_queue
from .broker import SqlmqBroker

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from ..broker import Broker

log = logging.getLogger("sqlmq")

#: Reads a far message's key from FastStream's message (None: it has none).
KeyOf = Callable[[Any], "str | None"]


def inbox_handler(
    broker: SqlmqBroker | Broker, queue: str, *, name: str | None = None,
    key_header: str | None = None, key: KeyOf | None = None, channel: str | None = None,
    retention: timedelta | float = DEFAULT_RETENTION, require_key: bool = True,
) -> Callable[..., Awaitable[None]]:
    """A handler for a far broker's FastStream subscriber that takes its messages into
    ``queue`` of ``broker`` (an :class:`SqlmqBroker`, or sqlmq's own ``Broker``) exactly
    once: register it with ``far.subscriber(...)(inbox_handler(broker, "orders"))``.

    ``name``: the source's name in the inbox's ledger (default ``faststream:<queue>``):
    name each far source that feeds one sqlmq queue, as their ids could meet. ``key_header``
    or ``key``: where each message's key is read instead of the far broker's id.
    ``channel``, ``retention`` and ``require_key`` are :class:`sqlmq.Inbox`'s. The handler
    acknowledges, nacks (the database failed for good: the far broker delivers it again) or
    rejects (no key, or too large for sqlmq) each message itself."""
    taker = _Taker(broker, check_queue(queue), name or f"faststream:{queue}", key_header,
                   key, channel, inbox_retention(retention), require_key)

    async def take_into_sqlmq(message: Any = Context("message")) -> None:
        await taker.take(message)

    take_into_sqlmq.__name__ = take_into_sqlmq.__qualname__ = f"inbox_into_{queue}"
    return take_into_sqlmq


class _Taker:
    """One inbox handler's state: the sqlmq broker, its ledger (made at the first message,
    once the broker is connected) and what it was told."""

    def __init__(self, broker: SqlmqBroker | Broker, queue: str, name: str,
                 key_header: str | None, key: KeyOf | None, channel: str | None,
                 retention: timedelta, require_key: bool) -> None:
        self.broker = broker
        self.queue = queue
        self.name = name
        self.key_header = key_header
        self.key = key
        self.channel = channel
        self.retention = retention
        self.require_key = require_key
        self.ledger: Ledger | None = None
        self.warned_acked = False
        self._opening = asyncio.Lock()

    async def take(self, message: Any) -> None:
        if message.committed is not None and not self.warned_acked:
            self.warned_acked = True
            log.warning("inbox into queue %r: the far broker's subscriber acknowledged the "
                        "message before the handler ran (an ack_policy of ACK_FIRST); a crash "
                        "then loses it: use the subscriber's default ack policy", self.queue)
        headers = text_headers(message.headers)
        key = self._key_of(message, headers)
        far = FarMessage(key=None if key is None else fitted_key(key),
                         body=bytes(message.body or b""), headers=headers)
        if far.key is None and self.require_key:
            await self._refuse(message, "it has no key (no message id, and no "
                                        f"{self.key_header or 'key'} header)")
            return
        core = await self._core()
        try:
            await self._retried(lambda: self._write(core, far))
        except PublishError as exc:
            await self._refuse(message, str(exc))
            return
        await message.ack()

    async def _write(self, core: Broker, far: FarMessage) -> None:
        if far.key is None:  # taken without a ledger row: at least once
            await self._publish(core, None, [far])
            return
        assert self.ledger is not None
        await self.ledger.write([far], lambda conn, ms: self._publish(core, conn, ms))

    async def _publish(self, core: Broker, conn: AsyncConnection | None,
                       messages: Sequence[FarMessage]) -> list[int]:
        return await core.publish_batch(
            self.queue, [m.body for m in messages], headers=[m.headers for m in messages],
            dedup_keys=[m.key for m in messages], channel=self.channel, connection=conn)

    async def _core(self) -> Broker:
        """sqlmq's broker, connected, and the ledger on its database."""
        async with self._opening:
            if isinstance(self.broker, SqlmqBroker):
                await self.broker.connect()
                core = self.broker.core
            else:
                core = self.broker
            if self.ledger is None:
                try:
                    db = core.db
                except ConfigurationError:
                    raise ConfigurationError(
                        f"the inbox needs a database for its ledger of the far messages "
                        f"taken; the broker on {core.url} keeps its messages in the process: "
                        "use a PostgreSQL, MySQL/MariaDB or SQLite URL") from None
                await core.check_schema()
                self.ledger = Ledger(db, core.schema, self.name, self.retention)
            return core

    async def _retried(self, work: Callable[[], Awaitable[None]]) -> None:
        """``work()``, retried with backoff while the database fails (the far message stays
        unacknowledged meanwhile; a stop cancels the wait and the far broker keeps it)."""
        faults = Backoff(f"inbox into queue {self.queue!r}")
        while True:
            try:
                await work()
                faults.succeeded()
                return
            except PublishError:
                raise
            except Exception as exc:
                await faults.failed(exc)

    async def _refuse(self, message: Any, reason: str) -> None:
        log.error("inbox into queue %r refused a message: %s", self.queue, reason)
        await message.reject()

    def _key_of(self, message: Any, headers: dict[str, str]) -> str | None:
        if self.key is not None:
            found = self.key(message)
        elif self.key_header is not None:
            found = headers.get(self.key_header)
        else:
            found = far_id(message.raw_message)
        return None if found is None or found == "" else str(found)


def far_id(raw: Any) -> str | None:
    """The far broker's own id of a message, from its client's object: aio-pika's
    ``message_id``, nats-py's ``Nats-Msg-Id`` header else its stream sequence, or the entry
    id of FastStream's Redis stream message."""
    if isinstance(raw, dict):  # FastStream's Redis message: {"message_ids": [...], ...}
        ids = raw.get("message_ids") or []
        return _text(ids[0]) if len(ids) == 1 else None
    if hasattr(raw, "metadata") and hasattr(raw, "data"):  # nats-py, from JetStream
        headers = raw.headers or {}
        return headers.get("Nats-Msg-Id") or str(raw.metadata.sequence.stream)
    if hasattr(raw, "message_id") and hasattr(raw, "body"):  # aio-pika
        return raw.message_id or None
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = ["inbox_handler"]
