"""What FastStream's endpoints read of an sqlmq broker: the sqlmq :class:`~sqlmq.Broker`
underneath (its engine and runtime do all the work), and the endpoint configurations.

FastStream composes configurations (a router's under its broker's), so the subscribers and
publishers find the sqlmq broker through their outer configuration at the moment they need
it, never by holding one of their own: a router's subscriber learns its broker when the
router is included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faststream._internal.configs import (
    BrokerConfig,
    SubscriberUsecaseConfig,
)
from faststream._internal.constants import EMPTY
from faststream.exceptions import IncorrectState
from faststream.middlewares import AckPolicy

if TYPE_CHECKING:
    from sqlmq import Broker


@dataclass(kw_only=True)
class SqlmqBrokerConfig(BrokerConfig):
    """A broker's configuration: FastStream's, plus the sqlmq broker that runs it."""

    #: The sqlmq broker underneath; None only in a router's own configuration.
    core: Broker | None = None
    #: Create or upgrade sqlmq's tables when the broker connects (else check them).
    migrate: bool = False

    async def connect(self) -> Broker:
        """Ready the producer, and the tables: migrated if asked, else checked, so a
        missing schema fails at start rather than at the first publish."""
        core = self.sqlmq_broker()
        self.producer.connect(self.fd_config._serializer, self.broker_codec)  # type: ignore[attr-defined]
        if self.migrate:
            await core.migrate()
        else:
            await core.check_schema()
        return core

    def sqlmq_broker(self) -> Broker:
        if self.core is None:
            raise IncorrectState("this router is not included in an SqlmqBroker yet")
        return self.core


@dataclass(kw_only=True)
class SqlmqSubscriberConfig(SubscriberUsecaseConfig):
    """One subscriber: its queues (or topics and group) and the options sqlmq's
    ``Broker.subscriber`` takes, passed through as they are."""

    queues: tuple[str, ...] = ()
    topic: tuple[str, ...] = ()
    group: str | None = None
    #: sqlmq's subscriber options (workers, lease, retry, publish_to, ...).
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def ack_policy(self) -> AckPolicy:
        """The subscriber's, else the broker's, else ``NACK_ON_ERROR``: sqlmq's default,
        under which a failure is retried by the subscriber's retry strategy."""
        if self._ack_policy is not EMPTY:
            return self._ack_policy
        outer = self._outer_config.ack_policy
        return AckPolicy.NACK_ON_ERROR if outer is EMPTY else outer
