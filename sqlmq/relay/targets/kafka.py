"""Kafka through FastStream's ``KafkaBroker`` (aiokafka underneath): every message sent with
``acks="all"`` and an idempotent producer, a send returning once the partition's in-sync
replicas have it.

The sqlmq id and publish time travel as the Kafka headers ``sqlmq-id`` and
``sqlmq-published-at`` (with the message's own headers), the publish time also as the
record's timestamp, and a message's sqlmq channel as its key, so that one channel's messages
land in one partition, in order. Kafka drops the duplicates of a producer's own retries
within one connection, not those of a relay that crashed: a consumer that must see a message
once skips the ``sqlmq-id`` values it has seen.

This target is tested with FastStream's ``TestKafkaBroker`` (an in-memory Kafka), never
against a Kafka server: see docs/relay.md.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.errors import MessageSizeTooLargeError
from faststream.kafka import KafkaBroker

from ..envelope import Envelope
from ..target import Refused
from ..urls import BrokerURL


class KafkaTarget:
    """Sends to ``topic`` (the queue's name unless given). ``kafka`` is FastStream's
    broker: a test wraps it in ``TestKafkaBroker`` before the first send."""

    OPTIONS = ("topic",)

    def __init__(self, url: BrokerURL, *, topic: str | None = None,
                 confirm_timeout: float = 10.0) -> None:
        self.url = url
        self.name = f"Kafka at {url.safe}"
        self.topic = topic
        self.confirm_timeout = confirm_timeout
        self.kafka = KafkaBroker([f"{host}:{port}" for host, port in url.hosts], acks="all",
                                 enable_idempotence=True,
                                 request_timeout_ms=int(confirm_timeout * 1000),
                                 logger=logging.getLogger("sqlmq.relay.kafka"))
        self._started = False

    async def open(self) -> None:
        await self.kafka.start()
        self._started = True

    def is_open(self) -> bool:
        return self._started

    async def send(self, envelope: Envelope) -> bool:
        topic = envelope.route("topic", self.topic) or envelope.queue
        key = envelope.channel.encode() if envelope.channel is not None else None
        try:
            await asyncio.wait_for(self.kafka.publish(
                envelope.payload, topic=topic, key=key, headers=envelope.id_headers(),
                timestamp_ms=int(envelope.published_at.timestamp() * 1000)),
                self.confirm_timeout)
        except MessageSizeTooLargeError as exc:
            raise Refused(f"{len(envelope.payload)} bytes: {exc}") from None
        return False

    async def close(self) -> None:
        if self._started:
            self._started = False
            try:
                await self.kafka.stop()
            except Exception:  # already broken: nothing left to close
                pass


__all__ = ["KafkaTarget"]
