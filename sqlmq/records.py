"""Plain records that cross the engine contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .states import Outcome

#: How many past delivery endings a message keeps (newest last).
HISTORY_LIMIT = 10


@dataclass(slots=True)  # not frozen: frozen dataclasses are built 4x slower, batches feel it
class NewMessage:
    """A message ready to insert: already encoded and validated."""

    queue: str
    payload: bytes
    headers: dict[str, str]
    delay: float = 0.0  # seconds from database now; ignored when ``at`` is set
    at: datetime | None = None


@dataclass(slots=True)
class Delivery:
    """One acquisition of a message. ``(id, deliveries)`` is the fencing token: every write
    after acquisition is conditional on it and on state PROCESSING."""

    id: int
    queue: str
    headers: dict[str, str]
    payload: bytes
    attempts: int
    deliveries: int
    created_at: datetime
    first_attempt_at: datetime | None
    acquired_at: datetime
    lease_expires_at: datetime
    scheduled_at: datetime | None
    history: list[dict[str, Any]] = field(default_factory=list)
    #: Why the row could not be decoded (None: it could). Such a delivery carries only its
    #: id, queue and counters; the runtime archives it FAILED with this reason without
    #: running a handler, so one malformed row never holds the rest of its batch back.
    defect: str | None = None


@dataclass(slots=True)  # not frozen, like NewMessage: one is built per message handled
class Settlement:
    """The result of one delivery, waiting to be flushed. Treat it as immutable."""

    id: int
    deliveries: int
    outcome: Outcome
    error: str | None = None
    delay: float = 0.0  # for RETRY
    refund: bool = False  # for RELEASE: the delivery never started, give it back
    attempted: bool = True  # the handler ran: counts as an attempt
    history: list[dict[str, Any]] | None = None  # the new history, when it changed


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    pending: int
    processing: int
    retryable: int
    completed: int
    failed: int
    oldest_ready_at: datetime | None


def history_entry(
    delivery: int, ended: str, at: datetime | None = None, error: str | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {"delivery": delivery, "ended": ended}
    if at is not None:
        entry["at"] = at.isoformat()
    if error:  # its first line: a handler's traceback stays in the error column only
        entry["error"] = error.split("\n", 1)[0][:500]
    return entry


def append_history(history: list[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [*history, entry][-HISTORY_LIMIT:]
