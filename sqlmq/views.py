"""The records of sqlmq's read-only views: a message as an operator sees it (live or
archived), a search of the archive, and what a queue did over recent windows.

The engines fill them (``message_view``, ``search_archive``, ``archive_activity``,
``archive_buckets``, ``latency_sample``, ``delivery_counts`` in :mod:`sqlmq.engines.contract`);
:mod:`sqlmq.insights` composes them for the CLI, the dashboard and the metrics, so no edge
writes its own SQL.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .codec import BYTES_TYPE, decode
from .errors import DecodeError
from .lifecycle import State

#: The archive states an operator calls dead letters: the message ended without success
#: and nothing will run it again unless someone requeues it.
DEAD_STATES: tuple[str, ...] = (State.FAILED.value, State.CANCELLED.value)
#: The states of the archive's rows.
ARCHIVED_STATES: tuple[str, ...] = (State.COMPLETED.value, State.FAILED.value,
                                    State.EXPIRED.value, State.CANCELLED.value)


@dataclass(frozen=True, slots=True)
class MessageView:
    """One message, from the message table (``archived_at`` None) or the archive."""

    id: int
    queue: str
    state: str
    headers: dict[str, str]
    payload: bytes
    priority: int
    attempts: int
    deliveries: int
    created_at: datetime
    archived_at: datetime | None = None
    #: When it is next due (live messages; None while it runs).
    next_attempt_at: datetime | None = None
    lease_expires_at: datetime | None = None
    #: The last error (live: the one that made it retry; archived: why it ended).
    error: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    channel: str | None = None
    #: What its handler returned, as a subscriber with ``results=True`` kept it (see
    #: :mod:`sqlmq.results`), encoded as :func:`sqlmq.codec.encode_state` stores a value;
    #: None: nothing kept. :meth:`result_parts` splits it.
    result: bytes | None = None
    #: When its first delivery was taken (None: never delivered).
    first_attempt_at: datetime | None = None
    #: When the delivery that holds it now was taken (live and PROCESSING only).
    acquired_at: datetime | None = None
    #: What it waits on (live only; a :class:`sqlmq.waits.Wait` value), and the signal it
    #: waits for, if its handler deferred it until one comes.
    waits: str | None = None
    waits_for: str | None = None

    @property
    def live(self) -> bool:
        return self.archived_at is None

    @property
    def key(self) -> tuple[datetime, int] | None:
        """The archive search's ``after`` for the page that follows this row."""
        return None if self.archived_at is None else (self.archived_at, self.id)

    def body(self) -> Any:
        """The payload decoded as JSON if it is JSON text, else as UTF-8 text, else None
        (binary: see :meth:`to_json`'s ``payload_base64``)."""
        try:
            text = self.payload.decode()
        except UnicodeDecodeError:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def result_parts(self) -> tuple[str, bytes] | None:
        """The kept result as its content type and its payload (None: none kept). A stored
        value not in sqlmq's format (a hand edit) shows whole, as bytes."""
        if self.result is None:
            return None
        kind, sep, payload = self.result.partition(b"\n")
        if not sep:
            return BYTES_TYPE, self.result
        return kind.decode("ascii", "replace"), payload

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: times in ISO 8601, the payload decoded (JSON or text) or in
        base64 when it is binary."""
        out: dict[str, Any] = {
            "id": self.id, "queue": self.queue, "state": self.state,
            "headers": self.headers, "priority": self.priority, "attempts": self.attempts,
            "deliveries": self.deliveries, "created_at": _iso(self.created_at),
            "archived_at": _iso(self.archived_at),
            "next_attempt_at": _iso(self.next_attempt_at),
            "lease_expires_at": _iso(self.lease_expires_at), "error": self.error,
            "history": self.history, "channel": self.channel,
            "first_attempt_at": _iso(self.first_attempt_at),
            "acquired_at": _iso(self.acquired_at), "waits": self.waits,
            "waits_for": self.waits_for,
        }
        try:
            self.payload.decode()
        except UnicodeDecodeError:
            out["payload_base64"] = base64.b64encode(self.payload).decode()
        else:
            out["payload"] = self.body()
        parts = self.result_parts()
        if parts is not None:
            out.update(_result_json(*parts))
        return out


@dataclass(frozen=True, slots=True)
class ArchiveQuery:
    """A page of the archive, newest first. Every filter given must match (None: any).
    ``after`` is the ``(archived_at, id)`` key of the last row of the previous page (keyset
    pagination: the next page costs the same however deep it is)."""

    queue: str | None = None
    states: tuple[str, ...] | None = None
    #: Text the error must contain (case-sensitive; a plain substring, no wildcards).
    error_contains: str | None = None
    archived_from: datetime | None = None
    archived_to: datetime | None = None
    after: tuple[datetime, int] | None = None
    limit: int = 50

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= 10_000:
            raise ValueError(f"an archive page holds 1 to 10000 rows, got {self.limit}")
        for state in self.states or ():
            if state not in ARCHIVED_STATES:
                raise ValueError(f"no archived state {state!r} (states: "
                                 f"{', '.join(ARCHIVED_STATES)})")


@dataclass(frozen=True, slots=True)
class WindowCount:
    """What left a queue in the last ``window`` seconds (from the archive)."""

    queue: str
    window: float
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0
    #: Of those, how many needed more than one delivery (they were retried or recovered).
    retried: int = 0


@dataclass(frozen=True, slots=True)
class BucketCount:
    """What left a queue in one bucket of a chart: the messages archived between
    ``(index + 1) * step`` and ``index * step`` seconds before now (database time; bucket 0
    is the newest), by final state, and how many of them took more than one delivery."""

    queue: str
    index: int
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0
    retried: int = 0


def bucket_index(steps: float, span: float, step: float) -> int:
    """The bucket of a row archived ``steps`` buckets of ``step`` seconds ago (its age over
    ``step``), in a chart of the last ``span`` seconds: a row a clock tick ahead of now
    goes in the newest, one archived exactly ``span`` ago in the oldest."""
    last = max(0, math.ceil(span / step) - 1)
    return min(max(0, math.floor(steps)), last)


def _result_json(content_type: str, payload: bytes) -> dict[str, Any]:
    """A kept result for JSON: ``result`` decoded (JSON or text), or ``result_base64``."""
    try:
        value = decode(payload, content_type)
    except DecodeError:
        value = payload
    if isinstance(value, bytes):
        return {"result_base64": base64.b64encode(value).decode()}
    return {"result": value}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


__all__ = ["ARCHIVED_STATES", "DEAD_STATES", "ArchiveQuery", "BucketCount", "MessageView",
           "WindowCount", "bucket_index"]
