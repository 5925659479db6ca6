"""sqlmq: a message broker that lives in your relational database."""

from .broker import Broker
from .channels import ChannelInfo, ChannelSettings
from .codec import decode, encode
from .connect import safe_url
from .engines import Engine, engine_for
from .errors import (
    AlreadySettled,
    ChannelFull,
    ConfigurationError,
    ConnectTimeout,
    DecodeError,
    EncodeError,
    HandlerSignatureError,
    PayloadTooLarge,
    PipelineError,
    PublishError,
    PublishOutcomeUnknown,
    SchemaError,
    SqlmqError,
    UnknownGroup,
)
from .lifecycle import AckPolicy, Outcome, State
from .message import Message
from .records import Cancellation, Delivery, Published, QueueStats, Settlement
from .retry import Retry, RetryStrategy
from .schedules import Cadence, Schedule, ScheduleInfo
from .schema import (
    SCHEMA_VERSION,
    Schema,
    archive_table,
    build_schema,
    message_table,
    metadata,
)
from .topics import TopicGroup, group_queue

__all__ = [
    "SCHEMA_VERSION",
    "AckPolicy",
    "AlreadySettled",
    "Broker",
    "Cadence",
    "Cancellation",
    "ChannelFull",
    "ChannelInfo",
    "ChannelSettings",
    "ConfigurationError",
    "ConnectTimeout",
    "DecodeError",
    "Delivery",
    "EncodeError",
    "Engine",
    "HandlerSignatureError",
    "Message",
    "Outcome",
    "PayloadTooLarge",
    "PipelineError",
    "PublishError",
    "PublishOutcomeUnknown",
    "Published",
    "QueueStats",
    "Retry",
    "RetryStrategy",
    "Schedule",
    "ScheduleInfo",
    "Schema",
    "SchemaError",
    "Settlement",
    "SqlmqError",
    "State",
    "TopicGroup",
    "UnknownGroup",
    "archive_table",
    "build_schema",
    "decode",
    "encode",
    "engine_for",
    "group_queue",
    "message_table",
    "metadata",
    "safe_url",
]
