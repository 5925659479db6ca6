"""Publishing: FastStream's publish command with sqlmq's options, and the producer that
hands it to :meth:`sqlmq.Broker.publish`.

The body is encoded the FastStream way (its serializer or codec: pydantic models,
dataclasses, ...), and the bytes go to sqlmq with the content type in the header sqlmq
itself reads, so any sqlmq consumer (a plain handler, Spark, the dashboard) reads them. The
write is sqlmq's: in the caller's transaction when ``connection`` is given (the outbox).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from faststream._internal.endpoint.publisher.fake import FakePublisher
from faststream._internal.endpoint.utils import ParserComposition
from faststream._internal.parser import DefaultCodec
from faststream._internal.producer import ProducerProto
from faststream.exceptions import FeatureNotSupportedException
from faststream.response import PublishCommand, Response
from faststream.response.publish_type import PublishType
from faststream.response.response import BatchPublishCommand

from sqlmq.codec import CONTENT_TYPE, encode

from .message import CORRELATION_ID, REPLY_TO, Reply, SqlmqParser

if TYPE_CHECKING:
    from fast_depends.library.serializer import SerializerProto
    from faststream._internal.parser import CodecProto
    from faststream._internal.types import CustomCallable
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    from .config import SqlmqBrokerConfig



class SqlmqResponse(Response):
    """A handler's return value with sqlmq's publish options, for the sqlmq publishers that
    decorate it (``@broker.publisher``): its delay, priority, channel, deduplication key."""

    def __init__(self, body: Any, *, headers: dict[str, Any] | None = None,
                 correlation_id: str | None = None, delay: float | timedelta | None = None,
                 at: datetime | None = None, priority: int = 0,
                 expires: float | timedelta | datetime | None = None,
                 dedup_key: str | None = None, channel: str | None = None) -> None:
        super().__init__(body, headers=headers, correlation_id=correlation_id)
        self.options: dict[str, Any] = {"delay": delay, "at": at, "priority": priority,
                                        "expires": expires, "dedup_key": dedup_key,
                                        "channel": channel}

    def as_publish_command(self) -> SqlmqPublishCommand:
        return SqlmqPublishCommand(self.body, headers=self.headers,
                                   correlation_id=self.correlation_id, **self.options)


class SqlmqPublishCommand(BatchPublishCommand):
    """FastStream's publish command, carrying what :meth:`sqlmq.Broker.publish` takes
    besides the body (``destination`` is the queue)."""

    def __init__(
        self, message: Any, /, *messages: Any, queue: str = "",
        headers: dict[str, Any] | None = None, correlation_id: str | None = None,
        reply_to: str = "", delay: float | timedelta | None = None, at: datetime | None = None,
        priority: int = 0, expires: float | timedelta | datetime | None = None,
        dedup_key: str | None = None, dedup_keys: list[str | None] | None = None,
        channel: str | None = None, connection: AsyncConnection | AsyncSession | None = None,
        timeout: float | None = 30.0, _publish_type: PublishType = PublishType.PUBLISH,
    ) -> None:
        super().__init__(message, *messages, destination=queue, headers=headers,
                         correlation_id=correlation_id, reply_to=reply_to,
                         _publish_type=_publish_type)
        self.timeout = timeout  # a request's: how long it waits for its answer
        self.delay = delay
        self.at = at
        self.priority = priority
        self.expires = expires
        self.dedup_keys = dedup_keys if dedup_key is None else [dedup_key]
        self.channel = channel
        self.connection = connection

    @classmethod
    def from_cmd(cls, cmd: PublishCommand, *, batch: bool = False) -> SqlmqPublishCommand:
        """A command from another broker's (or a handler's plain return value) as sqlmq's."""
        if isinstance(cmd, SqlmqPublishCommand):
            return cmd
        body, extra = cls._parse_bodies(cmd.body, batch=batch)
        return cls(body, *extra, queue=cmd.destination, headers=cmd.headers,
                   correlation_id=cmd.correlation_id, reply_to=cmd.reply_to,
                   _publish_type=cmd.publish_type)

    def headers_for(self, content_type: str | None) -> dict[str, str]:
        """The headers sqlmq stores: text values (sqlmq's headers are str to str), the
        content type the body was encoded with, the correlation id and the reply queue."""
        headers = {str(k): v if isinstance(v, str) else str(v)
                   for k, v in (self.headers or {}).items()}
        if content_type:
            headers[CONTENT_TYPE] = content_type
        if self.correlation_id:
            headers.setdefault(CORRELATION_ID, self.correlation_id)
        if self.reply_to:
            headers.setdefault(REPLY_TO, self.reply_to)
        return headers

    def options(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`sqlmq.Broker.publish_batch` besides the bodies."""
        return {"delay": self.delay, "at": self.at, "priority": self.priority,
                "expires": self.expires, "dedup_keys": self.dedup_keys,
                "channel": self.channel, "connection": self.connection}


class SqlmqProducer(ProducerProto[SqlmqPublishCommand]):
    """Writes FastStream's publish commands with the sqlmq broker of ``config``."""

    def __init__(self, config: SqlmqBrokerConfig, parser: CustomCallable | None = None,
                 decoder: CustomCallable | None = None) -> None:
        self._config = config
        default = SqlmqParser()
        self._parser = ParserComposition(parser, default.parse_message)
        self._decoder = ParserComposition(decoder, default.decode_message)
        self.serializer: SerializerProto | None = None
        self.codec: CodecProto = DefaultCodec()

    def connect(self, serializer: SerializerProto | None, codec: CodecProto | None) -> None:
        self.serializer = serializer or None
        if codec is not None:
            self.codec = codec

    async def publish(self, cmd: SqlmqPublishCommand) -> int:
        """Publish one message; returns sqlmq's id (a duplicate's, see ``dedup_key``)."""
        (msg_id,) = await self.publish_batch(cmd)
        return msg_id

    async def publish_batch(self, cmd: SqlmqPublishCommand) -> list[int]:
        """Publish the command's bodies to its queue, in one write when they share a content
        type (the usual case), else one write per content type, in the caller's transaction
        when it gives one."""
        bodies = cmd.batch_bodies
        if not bodies:
            return []
        encoded = [await self.codec.encode(body, self.serializer) for body in bodies]
        core = self._config.sqlmq_broker()
        options = cmd.options()
        kinds = {content_type for _, content_type in encoded}
        if len(kinds) == 1:
            return await core.publish_batch(cmd.destination, [p for p, _ in encoded],
                                            headers=cmd.headers_for(kinds.pop()), **options)
        keys = options.pop("dedup_keys") or [None] * len(encoded)
        ids = []
        for (payload, content_type), key in zip(encoded, keys, strict=True):
            ids += await core.publish_batch(cmd.destination, [payload],
                                            headers=cmd.headers_for(content_type),
                                            dedup_keys=None if key is None else [key],
                                            **options)
        return ids

    async def request(self, cmd: SqlmqPublishCommand) -> Reply:
        """Publish the command's message and wait up to its timeout for the result its
        subscriber keeps (``results=True``): :meth:`sqlmq.Broker.request`, the body encoded
        the FastStream way. The answer comes back as a :class:`Reply`, which the parser
        makes FastStream's response message; a message that failed, was cancelled or
        expired raises sqlmq's error, one not ended in time :class:`~sqlmq.ResultTimeout`
        (a ``TimeoutError``, as FastStream's other brokers raise)."""
        if cmd.connection is not None:
            raise FeatureNotSupportedException(
                "request() cannot publish in your transaction: it would wait for an answer "
                "that cannot come before the transaction commits")
        payload, content_type = await self.codec.encode(cmd.body, self.serializer)
        options = cmd.options()
        keys = options.pop("dedup_keys")
        for name in ("delay", "at", "connection"):
            if options.pop(name) is not None:
                raise FeatureNotSupportedException(f"request() takes no {name}=")
        value = await self._config.sqlmq_broker().request(
            cmd.destination, payload, headers=cmd.headers_for(content_type),
            timeout=cmd.timeout, dedup_key=keys[0] if keys else None, **options)
        body, kind = encode(value)
        return Reply(cmd.destination, {CONTENT_TYPE: kind,
                                       CORRELATION_ID: cmd.correlation_id or ""}, body)


class SqlmqReplyPublisher(FakePublisher):
    """Publishes a handler's answer to the queue a message named in ``reply_to``."""

    def __init__(self, producer: ProducerProto[Any], queue: str) -> None:
        super().__init__(producer=producer)
        self.queue = queue

    def patch_command(self, cmd: PublishCommand) -> SqlmqPublishCommand:
        real = SqlmqPublishCommand.from_cmd(super().patch_command(cmd))
        real.destination = self.queue
        return real

