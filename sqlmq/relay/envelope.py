"""What a relay hands a far broker for one sqlmq message: its body and headers, where it
goes, and the two facts a consumer needs to deduplicate and to date it, the sqlmq id and
the publish time, which every target puts in a field of its own (see docs/relay.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..message import Message

#: The header (or stream field, or MQTT user property) holding the sqlmq message id as
#: decimal text (after the relay's ``id_prefix``, if it has one), on every target.
ID_HEADER = "sqlmq-id"
#: The header holding the publish time: ISO 8601, UTC, to the microsecond.
PUBLISHED_AT_HEADER = "sqlmq-published-at"
#: A message's headers that name where it goes start with this; the rest of the name is the
#: option it overrides (``relay-routing-key`` for ``routing_key=``). They are not forwarded.
ROUTING_PREFIX = "relay-"


@dataclass(slots=True)
class Envelope:
    """One message as a target sends it. Made once per send, so not frozen: a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``, and with the
    publish time's formatting that was about a tenth of a relay's CPU per message to
    JetStream (bench/relay.py, py-spy). Targets only read it."""

    id: int
    #: The far broker's deduplication key: the relay's ``id_prefix`` and the id.
    key: str
    queue: str
    payload: bytes
    #: The message's headers, without its ``relay-*`` routing headers.
    headers: dict[str, str]
    content_type: str | None
    published_at: datetime
    channel: str | None
    #: The ``relay-*`` headers, by option name (``{"routing_key": "orders.eu"}``).
    routing: dict[str, str]

    @classmethod
    def of(cls, msg: Message, id_prefix: str = "") -> Envelope:
        headers = msg.headers
        routing: dict[str, str] = {}
        for name in headers:
            if name.startswith(ROUTING_PREFIX):
                headers, routing = _without_routing(headers)
                break
        return cls(msg.id, f"{id_prefix}{msg.id}", msg.queue, msg.payload, headers,
                   msg.content_type, msg.created_at, msg.channel, routing)

    def route(self, option: str, default: str | None) -> str | None:
        """Where this message goes for ``option``: its own ``relay-*`` header, else the
        relay's ``default``."""
        return self.routing.get(option, default)

    @property
    def published_iso(self) -> str:
        return iso_utc(self.published_at)

    def id_headers(self) -> dict[str, str]:
        """The message's headers with its id (the deduplication key) and publish time added."""
        return {**self.headers, ID_HEADER: self.key, PUBLISHED_AT_HEADER: self.published_iso}


def _without_routing(headers: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``headers`` without the ``relay-*`` ones, and those by option name."""
    kept, routing = {}, {}
    for name, value in headers.items():
        if name.startswith(ROUTING_PREFIX):
            routing[name[len(ROUTING_PREFIX):].replace("-", "_")] = value
        else:
            kept[name] = value
    return kept, routing


#: The last publish time :func:`iso_utc` formatted, and its text: messages published
#: together (a batch, one transaction) share their ``created_at``.
_last_iso: tuple[datetime | None, str] = (None, "")


def iso_utc(when: datetime) -> str:
    """``when`` in ISO 8601, UTC, to the microsecond (database time is UTC; some drivers
    drop the zone)."""
    global _last_iso
    last, text = _last_iso
    if when == last:
        return text
    utc = when
    if utc.tzinfo is not UTC:
        utc = utc.replace(tzinfo=UTC) if utc.tzinfo is None else utc.astimezone(UTC)
    text = utc.isoformat(timespec="microseconds")
    _last_iso = (when, text)
    return text


__all__ = ["ID_HEADER", "PUBLISHED_AT_HEADER", "ROUTING_PREFIX", "Envelope"]
