"""RabbitMQ through aio-pika: one connection and one channel in publisher-confirm mode for
every send of a relay, messages persistent and mandatory, so a send returns only once
RabbitMQ took the message (written to disk, for a durable queue) and routed it somewhere.

The sqlmq id travels as the AMQP ``message_id`` (and the ``sqlmq-id`` header), the publish
time as ``timestamp`` (whole seconds, as AMQP has it) and to the microsecond in the
``sqlmq-published-at`` header; the content type as ``content_type``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq import spec

from ..envelope import Envelope
from ..target import Refused
from ..urls import BrokerURL, quote_path

PERSISTENT = 2  # AMQP's delivery mode of a message a durable queue writes to disk
#: Seconds between two looks for confirmations later than the relay's ``confirm_timeout``.
SWEEP_EVERY = 0.25


class _ConnectFailures(logging.Filter):
    """aiormq logs an ERROR for every failed attempt to connect: while RabbitMQ is down, a
    line every few seconds for as long as the outage lasts. The relay's outage log says it
    once (:mod:`sqlmq.relay.outage`); this drops aiormq's."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("error when creating transport")


logging.getLogger("aiormq.connection").addFilter(_ConnectFailures())


class RabbitMQTarget:
    """Publishes to ``exchange`` (the default exchange: "") with ``routing_key`` (the
    queue's name unless given). An unroutable message (no queue bound) or a nack is a
    failed attempt: the message waits and goes again.

    Sends go through aio-pika's connection and channel to the aiormq channel beneath, with
    ``wait=False``: aio-pika's ``Exchange.publish`` holds the channel's lock until each
    frame is on the socket, so sends take turns with the writer task one by one, where
    these queue their frames at once and then await their confirmations together.

    ``confirm_timeout`` is kept by one task for every send (:meth:`_time_out`), not by
    aiormq's ``timeout=``, which makes a loop timer per publish: 13 % of a send's CPU
    (48 µs a message here, bench/relay.py's bare client with and without it)."""

    OPTIONS = ("exchange", "routing_key")

    def __init__(self, url: BrokerURL, *, exchange: str = "", routing_key: str | None = None,
                 confirm_timeout: float = 10.0) -> None:
        self.url = url
        self.name = f"RabbitMQ at {url.safe}"
        self.exchange = exchange
        self.routing_key = routing_key
        self.confirm_timeout = confirm_timeout
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._frames: aiormq.abc.AbstractChannel | None = None
        #: Each send awaiting its confirmation: [deadline, its task (None once it ended),
        #: whether the sweeper cancelled it].
        self._deadlines: deque[list[Any]] = deque()
        self._sweeper: asyncio.Task[None] | None = None

    async def open(self) -> None:
        u = self.url
        self._connection = await aio_pika.connect(
            host=u.host, port=u.port, login=u.username or "guest",
            password=u.password if u.password is not None else "guest",
            virtualhost=quote_path(u.path or "/"), ssl=u.tls)
        self._channel = await self._connection.channel(publisher_confirms=True,
                                                       on_return_raises=True)
        self._frames = await self._channel.get_underlay_channel()

    def is_open(self) -> bool:
        channel = self._channel
        return channel is not None and not channel.is_closed

    async def send(self, envelope: Envelope) -> bool:
        frames = self._frames
        assert frames is not None
        properties = spec.Basic.Properties(
            content_type=envelope.content_type, delivery_mode=PERSISTENT,
            headers=envelope.id_headers(), message_id=envelope.key,  # type: ignore[arg-type]
            timestamp=envelope.published_at)
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        waiting = [loop.time() + self.confirm_timeout, task, False]
        self._deadlines.append(waiting)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._time_out())
        try:
            await frames.basic_publish(
                envelope.payload, exchange=envelope.route("exchange", self.exchange) or "",
                routing_key=envelope.route("routing_key", self.routing_key) or envelope.queue,
                properties=properties, mandatory=True, wait=False)
        except asyncio.CancelledError:
            if waiting[2] and task is not None:  # the sweeper's cancel: a late confirmation
                task.uncancel()
                raise TimeoutError(f"RabbitMQ did not confirm within {self.confirm_timeout:g}"
                                   " s") from None
            raise
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            if "larger than" in str(exc):  # over RabbitMQ's max_message_size
                raise Refused(f"{len(envelope.payload)} bytes: {_reason(exc)}") from None
            raise
        finally:
            waiting[1] = None
        if waiting[2] and task is not None:  # confirmed just as the sweeper cancelled it:
            try:  # take the cancel back here, before it hits the handler's next await
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                task.uncancel()
        return False

    async def _time_out(self) -> None:
        """Cancel the sends whose confirmation is later than ``confirm_timeout`` (each then
        raises TimeoutError: a failed attempt, the message goes again)."""
        loop = asyncio.get_running_loop()
        deadlines = self._deadlines
        while deadlines:
            now = loop.time()
            while deadlines and (deadlines[0][1] is None or deadlines[0][0] <= now):
                waiting = deadlines.popleft()
                if waiting[1] is not None:
                    waiting[2] = True
                    waiting[1].cancel()
            await asyncio.sleep(SWEEP_EVERY)

    async def close(self) -> None:
        connection, self._connection, self._channel, self._frames = (self._connection, None,
                                                                    None, None)
        if connection is not None:
            try:
                await connection.close()
            except Exception:  # already gone: nothing left to close
                pass


def _reason(exc: Any) -> str:
    return str(exc.args[0] if getattr(exc, "args", None) else exc)


__all__ = ["RabbitMQTarget"]
