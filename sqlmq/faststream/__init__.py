"""sqlmq as a FastStream broker: ``from sqlmq.faststream import SqlmqBroker``.

A real FastStream broker (``FastStream(broker)``, ``faststream run``, middlewares,
FastDepends, AsyncAPI, ``TestSqlmqBroker``) on sqlmq's engine and runtime: the queues,
leases, retries, channels, outbox and settles are sqlmq's own. Needs the ``faststream``
extra (``pip install "sqlmq[faststream]"``); ``import sqlmq`` never imports FastStream.
See ``docs/faststream.md``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .annotations import SqlmqMessage, SqlmqRawMessage
from .broker import SqlmqBroker
from .inbox import inbox_handler
from .producer import SqlmqPublishCommand, SqlmqResponse
from .publisher import SqlmqPublisher
from .router import SqlmqRoute, SqlmqRouter
from .subscriber import SqlmqSubscriber
from .testing import TestSqlmqBroker

if TYPE_CHECKING:
    from .metrics import SqlmqPrometheusMiddleware
    from .telemetry import SqlmqTelemetryMiddleware

#: Imported on first use: OpenTelemetry is an extra of its own.
_LAZY = {"SqlmqTelemetryMiddleware": ".telemetry", "SqlmqPrometheusMiddleware": ".metrics"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = globals()[name] = getattr(import_module(_LAZY[name], __name__), name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SqlmqBroker",
    "SqlmqMessage",
    "SqlmqPrometheusMiddleware",
    "SqlmqPublishCommand",
    "SqlmqPublisher",
    "SqlmqRawMessage",
    "SqlmqResponse",
    "SqlmqRoute",
    "SqlmqRouter",
    "SqlmqSubscriber",
    "SqlmqTelemetryMiddleware",
    "TestSqlmqBroker",
    "inbox_handler",
]
