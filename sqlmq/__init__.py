"""sqlmq: a message broker that lives in your relational database.

The names below are imported on first use (PEP 562): a Spark worker that imports
``sqlmq.spark`` to read a queue loads neither the broker nor SQLAlchemy's asyncio and ORM
modules (about a second of CPU for each such worker on a small machine).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .broker import Broker
    from .channels import ChannelInfo, ChannelSettings
    from .codec import decode, encode
    from .connect import safe_url
    from .dead_letters import DeadLetter
    from .engines import Engine, engine_for
    from .errors import (
        AlreadySettled,
        ChannelFull,
        ConfigurationError,
        ConnectTimeout,
        DecodeError,
        EncodeError,
        HandlerSignatureError,
        MessageCancelled,
        MessageExpired,
        MessageFailed,
        NoResult,
        PayloadTooLarge,
        PipelineError,
        PublishError,
        PublishOutcomeUnknown,
        ResultError,
        ResultTimeout,
        SchemaError,
        SqlmqError,
        UnknownGroup,
        UnknownMessage,
        UnknownSchedule,
        UnknownWorkflow,
        UnstorableResult,
    )
    from .insights import (
        ArchivePage,
        ChannelOverview,
        Insights,
        Latency,
        QueueDetail,
        QueueOverview,
    )
    from .lifecycle import AckPolicy, Archive, Outcome, State
    from .maintenance.retention import Retention
    from .message import Message
    from .metrics import PrometheusMetrics, serve_metrics
    from .middleware import (
        CallNext,
        CallNextBatch,
        Middleware,
        MiddlewareError,
        PublishBatch,
        Settled,
    )
    from .records import (
        Answer,
        Cancellation,
        Delivery,
        PausedQueue,
        Published,
        QueueStats,
        Settlement,
        WorkerInfo,
    )
    from .relay.inbox import Inbox
    from .relay.relay import Relay
    from .results import AWAITED_HEADER
    from .retry import Retry, RetryStrategy
    from .schedules import Cadence, Schedule, ScheduleInfo
    from .schema import SCHEMA_VERSION, Schema, archive_table, build_schema, message_table, metadata
    from .search import SearchResult
    from .topics import TopicGroup, group_queue
    from .tracing import TracingMiddleware
    from .views import ArchiveQuery, MessageView, WindowCount
    from .workflows import (
        Dependency,
        OnFailure,
        Signal,
        StepStatus,
        Workflow,
        WorkflowStatus,
        WorkflowSummary,
    )


#: Where the names of ``__all__`` come from, searched in this order on first use.
_MODULES = (
    ".channels",
    ".codec",
    ".connect",
    ".dead_letters",
    ".engines",
    ".errors",
    ".insights",
    ".lifecycle",
    ".maintenance.retention",
    ".message",
    ".metrics",
    ".middleware",
    ".records",
    ".results",
    ".retry",
    ".schedules",
    ".schema",
    ".search",
    ".topics",
    ".tracing",
    ".views",
    ".workflows",
    ".broker",  # it imports most of the names above from where they live
    ".relay.inbox",  # none of the far brokers' clients until an inbox runs
    ".relay.relay",  # none of the far brokers' clients until a relay is made
)


def __getattr__(name: str) -> Any:
    if name in __all__:
        for source in _MODULES:
            module = import_module(source, __name__)
            if hasattr(module, name):
                value = globals()[name] = getattr(module, name)  # looked up once
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AWAITED_HEADER",
    "SCHEMA_VERSION",
    "AckPolicy",
    "AlreadySettled",
    "Answer",
    "Archive",
    "ArchivePage",
    "ArchiveQuery",
    "Broker",
    "Cadence",
    "CallNext",
    "CallNextBatch",
    "Cancellation",
    "ChannelFull",
    "ChannelInfo",
    "ChannelOverview",
    "ChannelSettings",
    "ConfigurationError",
    "ConnectTimeout",
    "DeadLetter",
    "DecodeError",
    "Delivery",
    "Dependency",
    "EncodeError",
    "Engine",
    "HandlerSignatureError",
    "Inbox",
    "Insights",
    "Latency",
    "Message",
    "MessageCancelled",
    "MessageExpired",
    "MessageFailed",
    "MessageView",
    "Middleware",
    "MiddlewareError",
    "NoResult",
    "OnFailure",
    "Outcome",
    "PausedQueue",
    "PayloadTooLarge",
    "PipelineError",
    "PrometheusMetrics",
    "PublishBatch",
    "PublishError",
    "PublishOutcomeUnknown",
    "Published",
    "QueueDetail",
    "QueueOverview",
    "QueueStats",
    "Relay",
    "ResultError",
    "ResultTimeout",
    "Retention",
    "Retry",
    "RetryStrategy",
    "Schedule",
    "ScheduleInfo",
    "Schema",
    "SchemaError",
    "SearchResult",
    "Settled",
    "Settlement",
    "Signal",
    "SqlmqError",
    "State",
    "StepStatus",
    "TopicGroup",
    "TracingMiddleware",
    "UnknownGroup",
    "UnknownMessage",
    "UnknownSchedule",
    "UnknownWorkflow",
    "UnstorableResult",
    "WindowCount",
    "WorkerInfo",
    "Workflow",
    "WorkflowStatus",
    "WorkflowSummary",
    "archive_table",
    "build_schema",
    "decode",
    "encode",
    "engine_for",
    "group_queue",
    "message_table",
    "metadata",
    "safe_url",
    "serve_metrics",
]
