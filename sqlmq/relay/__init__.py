"""Edges to real brokers: RabbitMQ, NATS JetStream, Redis Streams, MQTT and Kafka.

:class:`Relay` forwards a queue's messages to a far broker and archives each one only
after that broker confirmed it (see docs/relay.md). The far brokers' URLs are parsed by
:mod:`sqlmq.relay.urls`; each broker's client lives in its own module under
:mod:`sqlmq.relay.targets`, imported only when a relay to it is made, so ``import sqlmq``
never loads aio-pika, nats-py, redis, aiomqtt or FastStream.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .relay import Relay
    from .urls import BrokerURL, parse_broker_url

#: Each public name and the module of this package that defines it, imported on first use.
_WHERE = {
    "Relay": ".relay",
    "BrokerURL": ".urls",
    "parse_broker_url": ".urls",
}


def __getattr__(name: str) -> Any:
    source = _WHERE.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(import_module(source, __name__), name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = ["BrokerURL", "Relay", "parse_broker_url"]
