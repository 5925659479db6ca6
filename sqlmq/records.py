"""Plain records that cross the engine contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

# The lifecycle owns the settlement and the history; they are re-exported here, where the
# engines and the contract read the records that cross it.
from .lifecycle import HISTORY_LIMIT, Settlement, State, append_history, history_entry
from .new_messages import NewMessage, NewMessages

__all__ = ["HISTORY_LIMIT", "Answer", "Cancellation", "Delivery", "NewMessage", "NewMessages",
           "PausedQueue", "Published", "QueueStats", "Settlement", "Whereabouts", "WorkerBeat",
           "WorkerInfo", "append_history", "history_entry"]


class Published(int):
    """The id a publish with a deduplication key returns: the new message's, or with
    ``duplicate`` true, that of the message with the same key already waiting or running in
    the queue (nothing was written)."""

    duplicate: bool

    def __new__(cls, msg_id: int, duplicate: bool = False) -> Published:
        self = super().__new__(cls, msg_id)
        self.duplicate = duplicate
        return self

    def __getnewargs__(self) -> tuple[int, bool]:  # type: ignore[override]
        return int(self), self.duplicate

    def __repr__(self) -> str:
        return f"Published({int(self)}, duplicate={self.duplicate})"


def expiry_from(m: NewMessage | NewMessages, now: datetime) -> datetime | None:
    """When ``m`` expires if published at database time ``now``, as the engines' SQL works
    it out: ``now`` plus ``expires_in`` to the microsecond, else ``expires_at``; None: never.
    For an engine that knows ``now`` without reading the row back."""
    if m.expires_in is not None:
        return now + timedelta(microseconds=round(m.expires_in * 1_000_000))
    return None if m.expires_at is None else m.expires_at.astimezone(UTC)


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
    #: When it expires (database time; None: never). A delivery acquired at or after it is
    #: archived EXPIRED without running.
    expires_at: datetime | None = None
    #: What the handler saved with its last defer (encoded; None: nothing), and how many
    #: deliveries ended in a defer (not counted against ``max_deliveries``).
    saved_state: bytes | None = None
    defers: int = 0
    #: ``Broker.cancel`` asked for it while it ran: set by the acquire, and by the lease
    #: keeper for a delivery already held (the handler reads ``msg.cancel_requested``).
    cancel_requested: bool = False
    #: The channel it was published to (None: none). A written result of a channel's
    #: delivery may free the channel's slot or let its next ordered message start.
    channel: str | None = None
    #: Its channel has a concurrency limit or is ordered: others of the channel wait until
    #: its result is written, so the runtime writes it without waiting for the interval.
    holds_slot: bool = False
    #: Its channel's one limit was a concurrency limit when it was acquired, or it was
    #: ordered without other limits: the settle of its result may start the channel's
    #: next message in its slot (``settle_passing``).
    passes_slot: bool = False
    #: The runtime's own bound on the lease (event loop time; None: none known): when the
    #: statement that acquired or last extended it was sent, plus its seconds. The database
    #: cannot have expired the lease before then, so a handler still running when it comes
    #: is cancelled (:mod:`sqlmq.runtime.workers`) before another delivery can start.
    renewed_until: float | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    pending: int
    processing: int
    retryable: int
    completed: int
    failed: int
    oldest_ready_at: datetime | None
    expired: int = 0
    cancelled: int = 0


@dataclass(frozen=True, slots=True)
class Whereabouts:
    """Where a message is now (``Engine.whereabouts``): ``state``, its row's in the message
    table (PENDING, PROCESSING, RETRYABLE) or the archive's once it ended, and
    ``deliveries``, its delivery count there. Read to say why a settle left a result out."""

    state: str
    deliveries: int


@dataclass(frozen=True, slots=True)
class Answer:
    """How a message stands for a caller waiting on it (``Engine.answers``): ``state``, its
    row's in the message table while it waits or runs, the archive's once it ended; and
    for an archived one, the ``result`` its subscriber kept (encoded as
    :func:`sqlmq.codec.encode_state` stores a value; None: none kept) and its ``error``."""

    state: str
    result: bytes | None = None
    error: str | None = None

    @property
    def ended(self) -> bool:
        """Whether it is in the archive: nothing will run it again (unless requeued)."""
        return self.state not in _LIVE


_LIVE = frozenset({State.PENDING.value, State.PROCESSING.value, State.RETRYABLE.value})


@dataclass(frozen=True, slots=True)
class Cancellation:
    """What ``Broker.cancel(id)`` did. ``outcome``: ``"cancelled"`` (it was waiting: archived
    CANCELLED, never to be delivered), ``"requested"`` (it is running: flagged, its handler
    sees ``msg.cancel_requested``, and its result is archived CANCELLED unless it succeeds),
    ``"archived"`` (it had ended already, as ``state``: nothing changed) or ``"unknown"``
    (no message with that id, in the table or the archive)."""

    id: int
    outcome: Literal["cancelled", "requested", "archived", "unknown"]
    #: The message's state now: CANCELLED, PROCESSING, its archive state, or None.
    state: str | None = None

    def __str__(self) -> str:
        return {
            "cancelled": f"message {self.id} was waiting: cancelled, it will not run",
            "requested": f"message {self.id} is running: cancellation requested (its handler "
                         "sees msg.cancel_requested; unless it succeeds it ends CANCELLED)",
            "archived": f"message {self.id} had already ended as {self.state}: nothing to "
                        "cancel",
            "unknown": f"no message {self.id} (not waiting, running or archived)",
        }[self.outcome]


# ---- operations (schema version 11): the live workers registry and paused queues ----------


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """What one heartbeat of a running broker writes to its row of the workers registry
    (see :mod:`sqlmq.maintenance.heartbeat`). ``ttl``: seconds, on the database clock, for
    which the row is believed without another beat; after them the process is taken for
    dead and its row deleted."""

    id: str
    host: str
    pid: int
    version: str
    #: One JSON object per subscriber: its name, queues and settings, and its counts.
    subscribers: list[dict[str, Any]]
    running: int
    held: int
    ttl: float


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live broker, as ``await broker.workers()`` lists it: one that has started
    subscribers and whose last heartbeat is recent enough (``expires_at`` is ahead on the
    database clock). Counts are as of ``heartbeat_at``."""

    #: Made afresh by each start of a broker (a uuid).
    id: str
    host: str
    pid: int
    #: The sqlmq package version the process runs.
    version: str
    started_at: datetime
    heartbeat_at: datetime
    #: Without another heartbeat by then, the process is taken for dead.
    expires_at: datetime
    #: One JSON object per subscriber: ``name``, ``handler``, ``queues``, ``workers``,
    #: ``prefetch``, ``fetch_batch``, ``lease`` and its other settings, and its own
    #: ``running`` and ``held`` counts.
    subscribers: list[dict[str, Any]]
    #: Handlers in flight, over all its subscribers.
    running: int
    #: Deliveries fetched and not started yet (its prefetch buffers).
    held: int


@dataclass(frozen=True, slots=True)
class PausedQueue:
    """A paused queue: no process takes its messages until it is resumed (publishing goes
    on; the messages wait)."""

    queue: str
    #: Database time.
    paused_at: datetime
