"""FastStream's Prometheus middleware for sqlmq: ``SqlmqPrometheusMiddleware``.

FastStream's metrics (messages received, processed, published; their durations and
sizes) labelled by queue. sqlmq's own metrics (queue depths, oldest ready age, dead
letters: :mod:`sqlmq.metrics`) come from the database and stay sqlmq's; both can share one
registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from faststream._internal.constants import EMPTY
from faststream.prometheus import ConsumeAttrs, MetricsSettingsProvider
from faststream.prometheus.middleware import PrometheusMiddleware

from sqlmq import Message

from .producer import SqlmqPublishCommand

if TYPE_CHECKING:
    from faststream.message import StreamMessage
    from faststream.response import PublishCommand
    from prometheus_client import CollectorRegistry


class SqlmqMetricsSettingsProvider(MetricsSettingsProvider[Message, SqlmqPublishCommand]):
    """The labels of sqlmq's publishes and deliveries."""

    def __init__(self) -> None:
        self.messaging_system = "sqlmq"

    def get_consume_attrs_from_message(self, msg: StreamMessage[Message]) -> ConsumeAttrs:
        return {"destination_name": msg.raw_message.queue, "message_size": len(msg.body),
                "messages_count": 1}

    def get_publish_destination_name_from_cmd(self, cmd: PublishCommand) -> str:
        return cmd.destination


def settings_provider_factory(msg: Message | None) -> SqlmqMetricsSettingsProvider:
    return SqlmqMetricsSettingsProvider()


class SqlmqPrometheusMiddleware(PrometheusMiddleware[Message, SqlmqPublishCommand]):
    """FastStream's Prometheus middleware for an :class:`~sqlmq.faststream.SqlmqBroker`."""

    def __init__(self, *, registry: CollectorRegistry, app_name: str = EMPTY,
                 metrics_prefix: str = "faststream",
                 received_messages_size_buckets: Sequence[float] | None = None,
                 custom_labels: dict[str, str | Callable[[Any], str]] | None = None) -> None:
        super().__init__(
            settings_provider_factory=settings_provider_factory, registry=registry,
            app_name=app_name, metrics_prefix=metrics_prefix,
            received_messages_size_buckets=received_messages_size_buckets,
            custom_labels=custom_labels)
