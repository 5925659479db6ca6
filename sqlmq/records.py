"""Plain records that cross the engine contract."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, overload

# The lifecycle owns the settlement and the history; they are re-exported here, where the
# engines and the contract read the records that cross it.
from .lifecycle import HISTORY_LIMIT, Settlement, append_history, history_entry

__all__ = ["HISTORY_LIMIT", "Delivery", "NewMessage", "NewMessages", "Published",
           "QueueStats", "Settlement", "append_history", "history_entry"]


@dataclass(slots=True)  # not frozen: frozen dataclasses are built 4x slower
class NewMessage:
    """One message ready to insert: already encoded and validated. ``Engine.publish`` takes
    them as a :class:`NewMessages` batch; ``publish_leased`` takes one."""

    queue: str
    payload: bytes
    headers: dict[str, str]
    delay: float = 0.0  # seconds from database now; ignored when ``at`` is set
    at: datetime | None = None
    priority: int = 0  # higher is taken first among ready messages
    expires_in: float | None = None  # seconds from database now; ignored when ``expires_at``
    expires_at: datetime | None = None  # is set. Neither: it never expires
    dedup_key: str | None = None  # unique in its queue among waiting and running messages


@dataclass(slots=True)
class NewMessages(Sequence[NewMessage]):
    """The messages of one ``Engine.publish``, as columns: they share their queue, their
    schedule and their priority, so only the payloads and the headers are per message.
    Building a :class:`NewMessage` per message was a third of a large batch's client time
    on PostgreSQL; the engines' bulk paths read the columns, the rest index or iterate as
    any sequence of :class:`NewMessage` (built on the way). Messages of one content type
    share one headers dict (see :func:`sqlmq.publishing.prepare`), read-only."""

    queue: str
    payloads: list[bytes]
    headers: list[dict[str, str]]  # one per payload
    delay: float = 0.0  # seconds from database now; ignored when ``at`` is set
    at: datetime | None = None
    priority: int = 0
    expires_in: float | None = None  # as NewMessage's
    expires_at: datetime | None = None
    #: One deduplication key (or None) per payload; None: no message has one. A batch with
    #: keys takes each engine's keyed path (see :mod:`sqlmq.engines.core_publish`).
    dedup_keys: list[str | None] | None = None

    def __post_init__(self) -> None:
        if len(self.payloads) != len(self.headers):
            raise ValueError(f"{len(self.payloads)} payloads and {len(self.headers)} headers")
        if self.dedup_keys is not None and len(self.dedup_keys) != len(self.payloads):
            raise ValueError(f"{len(self.payloads)} payloads and {len(self.dedup_keys)} "
                             f"deduplication keys")

    @classmethod
    def of(cls, messages: Iterable[NewMessage]) -> NewMessages:
        """The batch of ``messages``, which must share their queue, schedule, priority and
        expiry (one publish writes one of each)."""
        items = list(messages)
        if not items:
            raise ValueError("a publish needs at least one message")
        first = items[0]
        shared = _shared(first)
        for m in items:
            if _shared(m) != shared:
                raise ValueError(f"one publish shares its queue, schedule, priority and "
                                 f"expiry: {m!r} differs from {first!r}")
        keys = [m.dedup_key for m in items]
        return cls(first.queue, [m.payload for m in items], [m.headers for m in items],
                   first.delay, first.at, first.priority, first.expires_in, first.expires_at,
                   keys if any(k is not None for k in keys) else None)

    def __len__(self) -> int:
        return len(self.payloads)

    @overload
    def __getitem__(self, index: int) -> NewMessage: ...
    @overload
    def __getitem__(self, index: slice) -> NewMessages: ...
    def __getitem__(self, index: int | slice) -> NewMessage | NewMessages:
        keys = self.dedup_keys
        if isinstance(index, slice):
            return NewMessages(self.queue, self.payloads[index], self.headers[index],
                               self.delay, self.at, self.priority, self.expires_in,
                               self.expires_at, None if keys is None else keys[index])
        return NewMessage(self.queue, self.payloads[index], self.headers[index], self.delay,
                          self.at, self.priority, self.expires_in, self.expires_at,
                          None if keys is None else keys[index])

    def pick(self, indexes: Sequence[int]) -> NewMessages:
        """The messages at ``indexes``, in that order, as a batch of their own."""
        keys = self.dedup_keys
        return NewMessages(self.queue, [self.payloads[i] for i in indexes],
                           [self.headers[i] for i in indexes], self.delay, self.at,
                           self.priority, self.expires_in, self.expires_at,
                           None if keys is None else [keys[i] for i in indexes])

    def __iter__(self) -> Iterator[NewMessage]:
        keys = self.dedup_keys or [None] * len(self.payloads)
        for payload, headers, key in zip(self.payloads, self.headers, keys, strict=True):
            yield NewMessage(self.queue, payload, headers, self.delay, self.at, self.priority,
                             self.expires_in, self.expires_at, key)


def _shared(m: NewMessage) -> tuple[Any, ...]:
    return (m.queue, m.delay, m.at, m.priority, m.expires_in, m.expires_at)


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
