"""The inbox from a NATS JetStream stream (nats-py): a durable pull consumer with explicit
acknowledgements, made if it does not exist; a message's key is its ``Nats-Msg-Id`` header
(the publisher's id, which JetStream's own deduplication uses too), else its stream
sequence.

Sequences start again at 1 in a stream deleted and made anew under the same name, so the
source's name in the inbox's ledger holds the stream's creation time: the new stream's
messages are not mistaken for the old one's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ...errors import ConfigurationError
from ..source import FarMessage, SourceOptions, SourceUnavailable, text_headers
from ..urls import BrokerURL
from . import describe

log = logging.getLogger("sqlmq")

#: The header JetStream deduplicates publishes by.
MSG_ID = "Nats-Msg-Id"


class JetStreamSource:
    """Consumes stream ``options.stream`` through the durable consumer ``options.group``
    (filtered to ``options.subject`` when given)."""

    def __init__(self, url: BrokerURL, options: SourceOptions) -> None:
        if not options.stream:
            raise ConfigurationError(f"the inbox from NATS ({url.safe}) needs the JetStream "
                                    "stream to consume: stream= (sqlmq inbox --stream)")
        self.url = url
        self.options = options
        self.durable = options.group or "sqlmq-inbox"
        self.shown = (f"JetStream stream {options.stream!r} (consumer {self.durable!r}) at "
                      f"{url.safe}")
        self._nc: Any = None
        self._sub: Any = None

    async def open(self) -> str:
        scheme = "tls" if self.url.tls else "nats"
        servers = [f"{scheme}://{host}:{port}" for host, port in self.url.hosts]
        self._nc = nc = NATS()
        try:
            # The first connection is tried twice, half a second apart (with reconnects for
            # ever, nats-py would retry it for ever); once connected, it reconnects for as
            # long as it takes.
            await nc.connect(
                servers=servers, user=self.url.username, password=self.url.password,
                connect_timeout=self.options.connect_timeout, max_reconnect_attempts=1,
                reconnect_time_wait=0.5, error_cb=self._error, disconnected_cb=self._quiet,
                reconnected_cb=self._quiet, closed_cb=self._quiet)
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            self._nc = None
            raise SourceUnavailable(f"cannot connect to NATS at {self.url.safe}: "
                                    f"{describe(nc.last_error or exc)}") from None
        nc.options.update(max_reconnect_attempts=-1, reconnect_time_wait=2.0)
        try:
            return await self._bind()
        except BaseException:
            await self.close()
            raise

    async def _bind(self) -> str:
        js = self._nc.jetstream()
        stream = self.options.stream
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            raise SourceUnavailable(f"NATS at {self.url.safe} has no JetStream stream "
                                    f"{stream!r}: add it first") from None
        except nats.js.errors.ServiceUnavailableError:
            raise SourceUnavailable(f"NATS at {self.url.safe} has no JetStream enabled "
                                    "(start nats-server with -js)") from None
        try:
            await js.consumer_info(stream, self.durable)
        except nats.js.errors.NotFoundError:
            await js.add_consumer(stream, ConsumerConfig(
                durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL, filter_subject=self.options.subject,
                ack_wait=30.0, max_ack_pending=max(self.options.prefetch, 1000)))
        self._sub = await js.pull_subscribe_bind(durable=self.durable, stream=stream)
        created = f"@{info.created.isoformat()}" if info.created is not None else ""
        return f"nats:{stream}{created}/{self.durable}"

    async def _error(self, exc: Exception) -> None:
        # a lost connection is the inbox's to log (once per incident), not each retry's
        log.log(logging.DEBUG if isinstance(exc, OSError | TimeoutError) else logging.WARNING,
                "inbox from %s: %s", self.shown, describe(exc))

    async def _quiet(self) -> None:
        return None

    async def fetch(self, limit: int, wait: float) -> list[FarMessage]:
        try:
            got = await self._sub.fetch(limit, timeout=wait)
        except nats.errors.TimeoutError:
            return []
        return [self._far(m) for m in got]

    def _far(self, msg: Any) -> FarMessage:
        headers = text_headers(msg.headers)
        if self.options.key_header:
            key = headers.get(self.options.key_header)
        else:
            key = headers.get(MSG_ID) or str(msg.metadata.sequence.stream)
        return FarMessage(key=key or None, body=msg.data, headers=headers, handle=msg)

    async def ack(self, messages: Sequence[FarMessage]) -> None:
        for m in messages:
            await m.handle.ack()
        await self._nc.flush()

    async def refuse(self, message: FarMessage, reason: str) -> None:
        await message.handle.term()  # never redelivered; advisories tell who listens

    async def close(self) -> None:
        nc, self._nc, self._sub = self._nc, None, None
        if nc is not None:
            try:
                await nc.close()
            except Exception:  # already broken: nothing to release
                pass


__all__ = ["MSG_ID", "JetStreamSource"]
