"""What the inbox asks of a far broker it takes messages from (:class:`Source`), one far
message as the inbox sees it (:class:`FarMessage`), the far headers made text, and the
choice of a source by its URL's scheme.

A source is a consumer that acknowledges explicitly: what :meth:`Source.fetch` returned is
held by the far broker (unacknowledged, redelivered if this process dies) until
:meth:`Source.ack`, which the inbox calls only once the database committed the messages.
Each source's client lives in its own module under :mod:`sqlmq.relay.sources`, imported
only when an inbox from that kind of broker is made.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from importlib import import_module
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigurationError, SqlmqError
from .urls import BrokerURL, parse_broker_url

log = logging.getLogger("sqlmq")

#: Each kind of far broker the inbox takes from, and the module (under
#: :mod:`sqlmq.relay.sources`) and class that consume from it.
SOURCES = {
    "rabbitmq": ("rabbitmq", "RabbitMQSource"),
    "nats": ("jetstream", "JetStreamSource"),
    "redis": ("redis_streams", "RedisStreamSource"),
}

#: The pip package of each kind's client; ``pip install 'sqlmq[inbox]'`` installs all three.
CLIENTS = {"rabbitmq": "aio-pika", "nats": "nats-py", "redis": "redis"}


class SourceUnavailable(SqlmqError):
    """The far broker cannot be used as asked: it does not answer, refuses the credentials,
    or has no such queue or stream. The message says which, and where."""


@dataclass(slots=True)
class FarMessage:
    """One far message: its key (the far broker's id for it, or the value of the header the
    inbox was told to read; None when it has neither), its body and text headers, and the
    client's own object, which the source needs to acknowledge it."""

    key: str | None
    body: bytes
    headers: dict[str, str]
    handle: Any = None


@dataclass(frozen=True)
class SourceOptions:
    """Where on the far broker the inbox reads. ``queue_name``: RabbitMQ's queue.
    ``stream``: a JetStream stream or a Redis stream. ``subject``: the subjects a JetStream
    consumer is filtered to (None: all the stream's). ``group``: the JetStream durable
    consumer's name, or the Redis consumer group. ``consumer``: this process's name within
    the Redis group (None: host and pid). ``key_header``: read each message's key from this
    header (a Redis field) instead of the far broker's id. ``prefetch``: how many messages
    the far broker may hand over unacknowledged. ``claim_idle``: seconds after which a Redis
    entry pending with another consumer (one that died) is claimed."""

    queue_name: str | None = None
    stream: str | None = None
    subject: str | None = None
    group: str | None = None
    consumer: str | None = None
    key_header: str | None = None
    prefetch: int = 1000
    claim_idle: float = 60.0
    connect_timeout: float = 10.0


@runtime_checkable
class Source(Protocol):
    """A far broker the inbox consumes from with explicit acknowledgements."""

    #: What it is and where, for the log (the URL's password masked).
    shown: str

    async def open(self) -> str:
        """Connect and make sure what is read from exists; returns the source's name in the
        inbox's ledger (where it reads, e.g. ``amqp:/orders``), unless the user named it.
        Raises :class:`SourceUnavailable` naming what is missing."""

    async def fetch(self, limit: int, wait: float) -> list[FarMessage]:
        """Up to ``limit`` messages, waiting up to ``wait`` seconds for the first; [] if none
        came."""

    async def ack(self, messages: Sequence[FarMessage]) -> None:
        """Acknowledge ``messages``: the far broker forgets them."""

    async def refuse(self, message: FarMessage, reason: str) -> None:
        """Give up on a message the inbox cannot take (no key, too large for sqlmq): the far
        broker's dead-lettering, where it has one, else acknowledged and logged."""

    async def close(self) -> None:
        """Close the connection, if any; never raises."""


def open_source(url: str | BrokerURL, options: SourceOptions) -> Source:
    """The source for ``url``'s kind of broker (not yet connected); a clear error for a
    kind the inbox does not take from, or whose client is not installed."""
    parsed = url if isinstance(url, BrokerURL) else parse_broker_url(url)
    found = SOURCES.get(parsed.kind)
    if found is None:
        kinds = ", ".join(sorted(SOURCES))
        raise ConfigurationError(f"the inbox takes from {kinds}, not {parsed.kind} "
                                 f"({parsed.safe})")
    module_name, class_name = found
    try:
        module = import_module(f".sources.{module_name}", __package__)
    except ImportError as exc:
        if exc.name is None or exc.name.startswith("sqlmq"):
            raise
        raise ConfigurationError(
            f"the inbox from {parsed.kind} needs the {CLIENTS[parsed.kind]} client "
            f"(missing module {exc.name!r}): pip install 'sqlmq[inbox]'") from None
    source: Source = getattr(module, class_name)(parsed, options)
    return source


def text_headers(raw: Mapping[Any, Any] | None) -> dict[str, str]:
    """A far message's headers as sqlmq keeps them, text to text: text as it is, bytes
    decoded as UTF-8 (base64 when they are not UTF-8), booleans ``true``/``false``, numbers
    as Python writes them, times in ISO 8601, lists and tables as JSON. A header without a
    value (None) is left out, and so is one holding a NUL character, which no database
    keeps in text."""
    out: dict[str, str] = {}
    for name, value in (raw or {}).items():
        name = _text(name)
        if value is None or not name:
            continue
        text = _text(value)
        if "\x00" in text or "\x00" in name:
            log.warning("inbox: header %r left out: it holds a NUL character", name)
            continue
        out[name] = text
    return out


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode("ascii")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    return json.dumps(value, default=_text, separators=(",", ":"), ensure_ascii=False)


__all__ = ["CLIENTS", "SOURCES", "FarMessage", "Source", "SourceOptions",
           "SourceUnavailable", "open_source", "text_headers"]
