"""The relay: a sqlmq subscriber whose handler sends each message to a far broker and
returns only once that broker confirmed it, so a message is archived only after it is
safely on the far side (the transactional outbox's last leg). A refusal or a lost
connection is a failed attempt, and the retry strategy decides when the message goes
again; by default it waits in the database for as long as the far broker is down.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigurationError
from ..message import Message
from ..middleware import Middleware
from ..retry import Retry, RetryStrategy
from .envelope import Envelope
from .link import Link
from .outage import Outage
from .target import Refused, Target, target_for

if TYPE_CHECKING:
    from ..broker import Broker
    from ..middleware import BrokerLike

log = logging.getLogger("sqlmq.relay")

#: The relay's default retry strategy: for ever, backing off to one try every 10 s. A far
#: broker's outage makes messages wait in the database, none is dead-lettered, and they go
#: within about 10 s of its return (see docs/relay.md).
DEFAULT_RETRY = Retry.exponential(initial=0.5, multiplier=2.0, max_attempts=None,
                                  max_delay=10.0, jitter=0.2)
#: Sends in flight at once: each handler awaits its own confirmation, so this many are
#: awaited together on the one connection.
DEFAULT_WORKERS = 256


@dataclass
class RelayStats:
    """What a relay did since it was made (this process only)."""

    #: Messages the far broker confirmed (each then archived COMPLETED).
    sent: int = 0
    #: Of those, the ones the far broker said it had already (JetStream's deduplication).
    duplicates: int = 0
    #: Failed attempts: the message went back to wait (the retry strategy's delay).
    failed: int = 0
    #: Messages the far broker can never take: dead-lettered (archived FAILED).
    refused: int = 0


class Relay:
    """Forward every message of ``queue`` to the far broker ``to``, confirmed.

    ``to`` is a URL whose scheme picks the broker: ``amqp://`` (RabbitMQ, with publisher
    confirms), ``nats://`` (NATS JetStream, awaiting its PubAck), ``redis://`` (a Redis
    stream, XADD), ``mqtt://`` (MQTT 5, QoS 1) or ``kafka://`` (Kafka through FastStream,
    with acks); or a target object made by hand (:mod:`sqlmq.relay.targets`). Where a
    message goes: ``exchange``/``routing_key`` (RabbitMQ; the default exchange and the
    queue's name unless given), ``subject`` (NATS), ``stream`` (Redis) or ``topic`` (MQTT,
    Kafka), each the queue's name unless given here or in the URL's query, and overridden
    per message by its header ``relay-routing-key``, ``relay-subject`` and so on.

    Every message carries its sqlmq id (``id_prefix`` before it: give one when relays from
    several databases share a far stream, whose deduplication would take equal ids for the
    same message) and its publish time in the far broker's own fields, so consumers can
    deduplicate: see docs/relay.md.

    ``workers`` sends are in flight at once on one connection. ``retry`` decides after a
    failed attempt (default :data:`DEFAULT_RETRY`: for ever). ``max_deliveries`` is None
    (no limit) so that crashes of the relay never dead-letter a message. The connection is
    closed when the broker stops (or by :meth:`close`).
    """

    def __init__(
        self, broker: Broker, queue: str, *, to: str | Target,
        exchange: str | None = None, routing_key: str | None = None,
        subject: str | None = None, stream: str | None = None, topic: str | None = None,
        id_prefix: str = "", workers: int = DEFAULT_WORKERS,
        retry: RetryStrategy | None = None, max_deliveries: int | None = None,
        lease: float = 30.0, confirm_timeout: float = 10.0, connect_timeout: float = 10.0,
    ) -> None:
        options = {"exchange": exchange, "routing_key": routing_key, "subject": subject,
                   "stream": stream, "topic": topic}
        self.queue = queue
        self.target: Target = target_for(to, options, confirm_timeout)
        self.id_prefix = id_prefix
        self.link = Link(self.target, connect_timeout)
        self.outage = Outage(f"relay of queue {queue!r} to {self.target.name}")
        self.stats = RelayStats()
        # No more fetched than the sends in flight can take: a killed relay strands what it
        # held for a lease, and whatever comes back twice that way then runs as a suspect,
        # one at a time (sqlmq.runtime.quarantine); the subscriber's default buffer of
        # twice a 1,000-message fetch would strand up to 2,000 behind every crash
        broker.subscriber(queue, workers=workers, fetch_batch=min(workers, 1000),
                          prefetch=workers, retry=retry or DEFAULT_RETRY,
                          max_deliveries=max_deliveries, lease=lease)(self.forward)
        try:
            broker.add_middleware(_CloseOnStop(self))
        except ConfigurationError:  # made after the broker started: close() is the caller's
            pass

    async def forward(self, msg: Message) -> None:
        """The handler: send ``msg`` and return once the far broker confirmed it (the
        message is then archived COMPLETED); nack it after a failed attempt; dead-letter it
        if the far broker can never take it."""
        started = asyncio.get_running_loop().time()
        try:
            duplicate = await self.link.send(Envelope.of(msg, self.id_prefix))
        except Refused as exc:
            self.stats.refused += 1
            log.error("%s: message %d refused, dead-lettered (archived FAILED): %s",
                      self.outage.what, msg.id, exc)
            msg.reject(f"refused by {self.target.name}: {exc}")
            return
        except Exception as exc:  # a lost connection, a nack, a timeout: a failed attempt
            self.stats.failed += 1
            self.outage.failed(exc)
            msg.nack()
            return
        self.stats.sent += 1
        if duplicate:
            self.stats.duplicates += 1
        self.outage.delivered(started)

    async def close(self) -> None:
        """Close the connection to the far broker (a later message opens it again)."""
        await self.link.close()

    def __repr__(self) -> str:
        return f"<Relay {self.queue!r} -> {self.target.name}>"


class _CloseOnStop(Middleware):
    """Closes the relay's connection when its broker stops."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    async def broker_stopped(self, broker: BrokerLike) -> None:
        await self.relay.close()


__all__ = ["DEFAULT_RETRY", "DEFAULT_WORKERS", "Relay", "RelayStats"]
