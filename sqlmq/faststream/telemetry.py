"""FastStream's OpenTelemetry middleware for sqlmq: ``SqlmqTelemetryMiddleware``.

FastStream's tracing middleware reads broker-specific attributes through a settings
provider; this one names the messaging system ``sqlmq``, the destination the queue, and
the message by sqlmq's id. The trace context travels in the message's headers, so a
consumer's span continues the publisher's, across processes. Needs ``opentelemetry-sdk``
(``pip install "faststream[otel]"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from faststream.opentelemetry import TelemetrySettingsProvider
from faststream.opentelemetry.consts import MESSAGING_DESTINATION_PUBLISH_NAME
from faststream.opentelemetry.middleware import TelemetryMiddleware
from opentelemetry.semconv.trace import SpanAttributes

from sqlmq import Message

from .producer import SqlmqPublishCommand

if TYPE_CHECKING:
    from faststream.message import StreamMessage
    from faststream.response import PublishCommand
    from opentelemetry.metrics import Meter, MeterProvider
    from opentelemetry.trace import TracerProvider

SYSTEM = "sqlmq"


class SqlmqTelemetrySettingsProvider(TelemetrySettingsProvider[Message, SqlmqPublishCommand]):
    """The span attributes of sqlmq's publishes and deliveries."""

    def __init__(self) -> None:
        self.messaging_system = SYSTEM

    def get_consume_attrs_from_message(self, msg: StreamMessage[Message]) -> dict[str, Any]:
        return {
            SpanAttributes.MESSAGING_SYSTEM: SYSTEM,
            SpanAttributes.MESSAGING_MESSAGE_ID: msg.message_id,
            SpanAttributes.MESSAGING_MESSAGE_CONVERSATION_ID: msg.correlation_id,
            SpanAttributes.MESSAGING_MESSAGE_PAYLOAD_SIZE_BYTES: len(msg.body),
            MESSAGING_DESTINATION_PUBLISH_NAME: msg.raw_message.queue,
        }

    def get_consume_destination_name(self, msg: StreamMessage[Message]) -> str:
        return msg.raw_message.queue

    def get_publish_attrs_from_cmd(self, cmd: PublishCommand) -> dict[str, Any]:
        return {
            SpanAttributes.MESSAGING_SYSTEM: SYSTEM,
            SpanAttributes.MESSAGING_DESTINATION_NAME: cmd.destination,
            SpanAttributes.MESSAGING_MESSAGE_CONVERSATION_ID: cmd.correlation_id,
        }

    def get_publish_destination_name(self, cmd: PublishCommand) -> str:
        return cmd.destination


class SqlmqTelemetryMiddleware(TelemetryMiddleware[SqlmqPublishCommand]):
    """Spans and metrics of FastStream's OpenTelemetry middleware for an
    :class:`~sqlmq.faststream.SqlmqBroker` (``middlewares=[SqlmqTelemetryMiddleware()]``)."""

    def __init__(self, *, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None, meter: Meter | None = None,
                 include_messages_counters: bool = True) -> None:
        super().__init__(
            settings_provider_factory=lambda _: SqlmqTelemetrySettingsProvider(),
            tracer_provider=tracer_provider, meter_provider=meter_provider, meter=meter,
            include_messages_counters=include_messages_counters)
