"""Plain records that cross the engine contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# The lifecycle owns the settlement and the history; they are re-exported here, where the
# engines and the contract read the records that cross it.
from .lifecycle import HISTORY_LIMIT, Settlement, append_history, history_entry

__all__ = ["HISTORY_LIMIT", "Delivery", "NewMessage", "QueueStats", "Settlement",
           "append_history", "history_entry"]


@dataclass(slots=True)  # not frozen: frozen dataclasses are built 4x slower, batches feel it
class NewMessage:
    """A message ready to insert: already encoded and validated. The messages of one
    ``Engine.publish`` share their queue, their schedule and their priority (one
    ``publish_batch``)."""

    queue: str
    payload: bytes
    headers: dict[str, str]
    delay: float = 0.0  # seconds from database now; ignored when ``at`` is set
    at: datetime | None = None
    priority: int = 0  # higher is taken first among ready messages


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
    #: The message's priority (higher is taken first among ready messages).
    priority: int = 0


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    pending: int
    processing: int
    retryable: int
    completed: int
    failed: int
    oldest_ready_at: datetime | None
