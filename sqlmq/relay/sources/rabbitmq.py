"""The inbox from a RabbitMQ queue (aio-pika): a consumer with manual acknowledgements and a
prefetch window, its messages' key the AMQP ``message_id`` (or a header's value).

Acknowledgements go per channel, one ``basic.ack`` with ``multiple`` for the highest
delivery tag of a batch: every earlier tag of the channel was either in that batch or
settled before it, since the inbox takes the messages in the order they arrived.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aio_pika
import aiormq

from ...errors import ConfigurationError
from ..source import FarMessage, SourceOptions, SourceUnavailable, text_headers
from ..urls import BrokerURL
from . import describe


class RabbitMQSource:
    """Consumes ``options.queue_name`` on the URL's virtual host."""

    def __init__(self, url: BrokerURL, options: SourceOptions) -> None:
        if not options.queue_name:
            raise ConfigurationError(f"the inbox from RabbitMQ ({url.safe}) needs the queue to "
                                    "consume: queue_name= (sqlmq inbox --queue-name)")
        self.url = url
        self.options = options
        self.vhost = url.path or "/"
        self.shown = f"RabbitMQ queue {options.queue_name!r} at {url.safe}"
        self._connection: Any = None
        self._arrived: asyncio.Queue[Any] = asyncio.Queue()

    async def open(self) -> str:
        self._arrived = asyncio.Queue()  # what a closed connection delivered is redelivered
        try:
            self._connection = await aio_pika.connect(
                self.url.url, timeout=self.options.connect_timeout)
        except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
            raise SourceUnavailable(
                f"cannot connect to RabbitMQ at {self.url.safe}: {_describe(exc)}") from None
        try:
            channel = await self._connection.channel()
            await channel.set_qos(prefetch_count=self.options.prefetch)
            queue = await channel.declare_queue(self.options.queue_name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            await self.close()
            raise SourceUnavailable(
                f"RabbitMQ at {self.url.safe} has no queue {self.options.queue_name!r} on "
                f"virtual host {self.vhost!r}: declare it (and bind it) first") from None
        await queue.consume(self._arrive, no_ack=False)
        name = self.options.queue_name
        return f"rabbitmq:{name}" if self.vhost == "/" else f"rabbitmq:{self.vhost}:{name}"

    async def _arrive(self, message: Any) -> None:
        self._arrived.put_nowait(message)

    async def fetch(self, limit: int, wait: float) -> list[FarMessage]:
        if self._connection is None or self._connection.is_closed:
            raise ConnectionError(f"the connection to RabbitMQ at {self.url.safe} is closed")
        arrived = self._arrived
        if arrived.empty():
            try:
                first = await asyncio.wait_for(arrived.get(), wait)
            except TimeoutError:
                return []
            taken = [first]
        else:
            taken = []
        while len(taken) < limit and not arrived.empty():
            taken.append(arrived.get_nowait())
        return [self._far(m) for m in taken]

    def _far(self, message: Any) -> FarMessage:
        headers = text_headers(message.headers)
        if message.content_type:
            headers.setdefault("content-type", message.content_type)
        header = self.options.key_header
        key = headers.get(header) if header else message.message_id
        return FarMessage(key=key or None, body=message.body, headers=headers, handle=message)

    async def ack(self, messages: Sequence[FarMessage]) -> None:
        highest: dict[int, tuple[Any, int]] = {}
        for m in messages:
            channel, tag = m.handle.channel, m.handle.delivery_tag
            if id(channel) not in highest or tag > highest[id(channel)][1]:
                highest[id(channel)] = (channel, tag)
        for channel, tag in highest.values():
            await channel.basic_ack(delivery_tag=tag, multiple=True)

    async def refuse(self, message: FarMessage, reason: str) -> None:
        # to the queue's dead-letter exchange, if it has one; dropped otherwise
        await message.handle.channel.basic_reject(delivery_tag=message.handle.delivery_tag,
                                                  requeue=False)

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await connection.close()
            except Exception:  # already broken: nothing to release
                pass


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return describe(exc)


__all__ = ["RabbitMQSource"]
