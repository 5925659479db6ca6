"""Messages on their way in: validated and encoded, not yet written.

Below the lifecycle and the records (it imports nothing of sqlmq's), so that a settlement
can carry what a pipeline step publishes onward (:attr:`sqlmq.lifecycle.Settlement.outputs`).
:mod:`sqlmq.records` re-exports both classes with the other records that cross the contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, overload

__all__ = ["NewMessage", "NewMessages", "joined"]


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
    channel: str | None = None  # see sqlmq.channels


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
    #: keys takes each engine's keyed path (see :mod:`sqlmq.engines.sql.publish`).
    dedup_keys: list[str | None] | None = None
    #: The channel all of them go to (see :mod:`sqlmq.channels`); None: none.
    channel: str | None = None

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
                   keys if any(k is not None for k in keys) else None, first.channel)

    def __len__(self) -> int:
        return len(self.payloads)

    @property
    def core_only(self) -> bool:
        """Whether only the Core publish writes these (:mod:`sqlmq.engines.sql.publish`):
        deduplication keys, or a channel, bypass the engines' fast paths."""
        return self.dedup_keys is not None or self.channel is not None

    @overload
    def __getitem__(self, index: int) -> NewMessage: ...
    @overload
    def __getitem__(self, index: slice) -> NewMessages: ...
    def __getitem__(self, index: int | slice) -> NewMessage | NewMessages:
        keys = self.dedup_keys
        if isinstance(index, slice):
            return NewMessages(self.queue, self.payloads[index], self.headers[index],
                               self.delay, self.at, self.priority, self.expires_in,
                               self.expires_at, None if keys is None else keys[index],
                               self.channel)
        return NewMessage(self.queue, self.payloads[index], self.headers[index], self.delay,
                          self.at, self.priority, self.expires_in, self.expires_at,
                          None if keys is None else keys[index], self.channel)

    def pick(self, indexes: Sequence[int]) -> NewMessages:
        """The messages at ``indexes``, in that order, as a batch of their own."""
        keys = self.dedup_keys
        return NewMessages(self.queue, [self.payloads[i] for i in indexes],
                           [self.headers[i] for i in indexes], self.delay, self.at,
                           self.priority, self.expires_in, self.expires_at,
                           None if keys is None else [keys[i] for i in indexes], self.channel)

    def __iter__(self) -> Iterator[NewMessage]:
        keys = self.dedup_keys or [None] * len(self.payloads)
        for payload, headers, key in zip(self.payloads, self.headers, keys, strict=True):
            yield NewMessage(self.queue, payload, headers, self.delay, self.at, self.priority,
                             self.expires_in, self.expires_at, key, self.channel)


def _shared(m: NewMessage) -> tuple[Any, ...]:
    return (m.queue, m.delay, m.at, m.priority, m.expires_in, m.expires_at, m.channel)


def joined(batches: Iterable[NewMessages]) -> list[NewMessages]:
    """``batches`` as few batches as they make: those that share their queue, schedule,
    priority and expiry become one, in order. A flush of a pipeline step carries one output
    batch per settlement; joined, each queue's outputs are one insert, not one per message."""
    out: dict[tuple[Any, ...], NewMessages] = {}
    for b in batches:
        key = (b.queue, b.delay, b.at, b.priority, b.expires_in, b.expires_at, b.channel)
        into = out.get(key)
        if into is None:
            out[key] = NewMessages(b.queue, list(b.payloads), list(b.headers), b.delay, b.at,
                                   b.priority, b.expires_in, b.expires_at,
                                   None if b.dedup_keys is None else list(b.dedup_keys),
                                   b.channel)
            continue
        if into.dedup_keys is not None or b.dedup_keys is not None:
            into.dedup_keys = ((into.dedup_keys or [None] * len(into))
                               + (b.dedup_keys or [None] * len(b)))
        into.payloads += b.payloads
        into.headers += b.headers
    return list(out.values())
