"""The in-memory engine: the whole engine contract on Python dicts, for unit tests.

``Broker("memory://")`` runs on it: a user's test publishes, runs handlers and asserts
without a database. It keeps the SQL engines' semantics exactly (the contract suite in
``tests/contract/`` runs the same scenarios on all four engines): ids that increase,
acquire by priority then in ready order, leases and fencing on ``(id, deliveries)`` and
state PROCESSING, every settle outcome column by column, recovery with its
``lease_expired`` history entry, requeue and purge of the archive. Its clock is the
database clock: :attr:`MemoryEngine.clock` plus whatever :meth:`MemoryEngine.advance`
added, so a test moves time forward instead of sleeping through delays, leases and retries.

Nothing is shared between processes and nothing survives the process: this engine is a
test double for sqlmq's users, never a stand-in for a database in a test of sqlmq itself.
"""

from __future__ import annotations

import heapq
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from ...channels import Turns, freed_slots
from ...commit_hooks import on_commit
from ...dead_letters import DeadLetterNotice
from ...lifecycle import Outcome, State, records_ending
from ...records import (
    HISTORY_LIMIT,
    Cancellation,
    Delivery,
    NewMessage,
    NewMessages,
    Published,
    QueueStats,
    Settlement,
    Whereabouts,
    WorkerInfo,
    append_history,
    expiry_from,
    history_entry,
)
from ...schedules import ScheduleInfo
from ...schema import SCHEMA_VERSION, Schema
from ...topics import TopicGroup, group_queue, queues_for
from ...views import ArchiveQuery
from ..sql.settle_onward import outputs_of
from .browse import MemoryBrowsing
from .channels import MemoryChannelAdmin, MemoryChannels
from .insights import MemoryInsights
from .operations import MemoryOperations
from .results import MemoryResults
from .schedules import MemorySchedules
from .transactions import begin_callers, transaction_owner
from .workflows import MemoryWorkflowCalls, MemoryWorkflows

Clock = Callable[[], datetime]


def real_time() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class Row:
    """A row of the message table (PENDING, PROCESSING or RETRYABLE)."""

    id: int
    queue: str
    headers: dict[str, str]
    payload: bytes
    created_at: datetime
    next_attempt_at: datetime | None  # None exactly while PROCESSING, as in the schema
    state: str = State.PENDING
    attempts_count: int = 0
    deliveries_count: int = 0
    first_attempt_at: datetime | None = None
    acquired_at: datetime | None = None
    last_attempt_at: datetime | None = None
    lease_expires_at: datetime | None = None
    last_error: str | None = None
    history: list[dict[str, Any]] | None = None
    priority: int = 0
    expires_at: datetime | None = None
    dedup_key: str | None = None
    saved_state: bytes | None = None
    defers_count: int = 0
    cancel_requested: int = 0
    channel: str | None = None  # see sqlmq.channels: a channel's message waits on
    channel_due_at: datetime | None = None  # channel_due_at, next_attempt_at None
    fair_key: int | None = None  # a channel message's place in the fair order
    waits_for: str | None = None  # the signal a deferred message waits for

    def wait_until(self, due: datetime) -> None:
        """Back to waiting until ``due``: a channel's message apart from the plain ones."""
        if self.channel is None:
            self.next_attempt_at = due
        else:
            self.channel_due_at = due


@dataclass(slots=True)
class Archived:
    """A row of the archive (COMPLETED, FAILED, EXPIRED or CANCELLED)."""

    id: int
    queue: str
    headers: dict[str, str]
    payload: bytes
    state: str
    attempts_count: int
    deliveries_count: int
    created_at: datetime
    first_attempt_at: datetime | None
    last_attempt_at: datetime | None
    archived_at: datetime
    error: str | None
    history: list[dict[str, Any]] | None
    priority: int = 0
    channel: str | None = None
    #: What its handler returned, kept (``results=True``; see :mod:`sqlmq.results`).
    result: bytes | None = None


def ready_key(row: Row) -> tuple[Any, ...]:
    """The order acquire takes ready messages in, as the SQL engines' ``ORDER BY``: highest
    priority first, then ready time, then id. A new ordering column goes first in this
    tuple and nowhere else."""
    return (-row.priority, row.next_attempt_at, row.id)


def _waiting_row(a: Archived) -> Row:
    """Archived workflow step ``a`` back in the table, waiting for its dependencies (a
    requeue of one of them revived it: see :mod:`.workflows`)."""
    return Row(a.id, a.queue, a.headers, a.payload, a.created_at, None, state=State.WAITING,
               history=a.history, priority=a.priority)


def _copy(history: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A history as a database would hand it out: a fresh object on every read, so a caller
    changing what it got does not change the row (a SQL row goes through JSON text)."""
    return None if history is None else [dict(entry) for entry in history]


def _stamped(history: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """A settlement's new history as the SQL engines' settle writes it: the entry the runtime
    appended (without a time: it reads no clock) at the database's time, ``now``, unless it
    has a time already."""
    out = [dict(entry) for entry in history]
    if out:
        out[-1].setdefault("at", now.isoformat(timespec="microseconds"))
    return out


@dataclass
class MemoryStore:
    """The two tables and the id sequence; every method is one transaction at ``now``."""

    rows: dict[int, Row] = field(default_factory=dict)
    by_queue: dict[str, dict[int, Row]] = field(default_factory=dict)
    archive: dict[int, Archived] = field(default_factory=dict)
    last_id: int = 0
    #: (queue, dedup key) -> the id of the row holding it: in the table, or published in a
    #: transaction not yet ended (the SQL engines' unique index, which makes a second
    #: publisher wait for that transaction; here it is told at once)
    keys: dict[tuple[str, str], int] = field(default_factory=dict)
    #: The consumer groups of topics, by queue.
    groups: dict[str, TopicGroup] = field(default_factory=dict)
    #: Periodic schedules, by name.
    schedules: dict[str, ScheduleInfo] = field(default_factory=dict)
    #: Channels and the queues' defaults for them.
    channels: MemoryChannels = field(default_factory=MemoryChannels)
    #: Which goes first in the next acquire, the channels or the plain messages.
    channels_first: bool = False
    #: Paused queues, and when each was paused (schema version 11).
    paused: dict[str, datetime] = field(default_factory=dict)
    #: The live workers registry, by worker id.
    workers: dict[str, WorkerInfo] = field(default_factory=dict)

    def new_rows(self, messages: NewMessages, now: datetime) -> tuple[list[Row], list[int]]:
        """Rows for ``messages`` with their ids taken (in order), not yet visible, and the
        ids the publish returns: a message whose key is held is that holder's duplicate
        and gets no row."""
        at = messages.at
        ready = now + timedelta(seconds=messages.delay) if at is None else at.astimezone(UTC)
        expires_at = expiry_from(messages, now)
        rows: list[Row] = []
        ids: list[int] = []
        keys = messages.dedup_keys or [None] * len(messages)
        channel = messages.channel
        turn: int | None = None
        if channel is not None:
            turn = self.channels.admit(channel, messages.queue, len(messages),
                                       self.rows.values(), now)
        for i, (payload, headers, key) in enumerate(zip(messages.payloads, messages.headers,
                                                        keys, strict=True)):
            if key is not None:
                held = self.keys.get((messages.queue, key))
                if held is not None:
                    ids.append(Published(held, True))
                    continue
            self.last_id += 1
            rows.append(Row(self.last_id, messages.queue, dict(headers), payload, now,
                            ready if channel is None else None, priority=messages.priority,
                            expires_at=expires_at, dedup_key=key, channel=channel,
                            channel_due_at=None if channel is None else ready,
                            fair_key=None if turn is None else turn.key(
                                messages.priority, i)))
            if key is None:
                ids.append(self.last_id)
            else:
                self.keys[messages.queue, key] = self.last_id
                ids.append(Published(self.last_id, False))
        return rows, ids

    def free_keys(self, rows: Iterable[Row]) -> None:
        """The keys of ``rows`` (leaving the table, or never entering it) are free again."""
        for row in rows:
            if row.dedup_key is not None and self.keys.get((row.queue, row.dedup_key)) == row.id:
                del self.keys[row.queue, row.dedup_key]

    def add(self, rows: Iterable[Row]) -> None:
        for row in rows:
            self.rows[row.id] = row
            self.by_queue.setdefault(row.queue, {})[row.id] = row

    def drop_queue(self, queue: str) -> int:
        """Delete the messages of ``queue`` (a deleted group's): how many."""
        rows = list(self.by_queue.pop(queue, {}).values())
        for row in rows:
            del self.rows[row.id]
        self.free_keys(rows)
        return len(rows)

    def _remove(self, row: Row) -> None:
        del self.rows[row.id]
        del self.by_queue[row.queue][row.id]
        self.free_keys([row])

    def acquire(self, queues: Sequence[str], limit: int, lease: float,
                now: datetime) -> list[Delivery]:
        """The plain messages and the channels' (:mod:`.channels`), each first
        every other time, as the SQL engines' acquire; nothing of a paused queue."""
        key, queues = tuple(queues), [q for q in queues if q not in self.paused]
        if not self.channels.channels:
            return self._acquire_plain(queues, limit, lease, now)
        self.channels_first = not self.channels_first

        def take(r: Row, scheduled: datetime | None) -> Delivery:
            return _take(r, scheduled, lease, now)

        def channels(n: int) -> list[Delivery]:
            return self.channels.acquire(self.rows.values(), queues, n, now, take, key)

        first = channels(limit) if self.channels_first else self._acquire_plain(
            queues, limit, lease, now)
        if len(first) >= limit:
            return first
        left = limit - len(first)
        return first + (self._acquire_plain(queues, left, lease, now) if self.channels_first
                        else channels(left))

    def _acquire_plain(self, queues: Sequence[str], limit: int, lease: float,
                       now: datetime) -> list[Delivery]:
        ready = [r for q in dict.fromkeys(queues) for r in self.by_queue.get(q, {}).values()
                 if r.next_attempt_at is not None and r.next_attempt_at <= now]
        out = []
        for r in heapq.nsmallest(max(limit, 0), ready, key=ready_key):
            scheduled, r.next_attempt_at = r.next_attempt_at, None
            out.append(_take(r, scheduled, lease, now))
        return out

    def held(self, msg_id: int, deliveries: int) -> Row | None:
        """The row of delivery ``(msg_id, deliveries)`` if that delivery still holds it."""
        row = self.rows.get(msg_id)
        if row is None or row.deliveries_count != deliveries or row.state != State.PROCESSING:
            return None
        return row

    def settle(self, settlements: Sequence[Settlement], now: datetime) -> set[int]:
        applied: set[int] = set()
        # archives first, then moves back, as the SQL engines' statements run
        for s in sorted(settlements, key=lambda s: not s.outcome.archives):
            row = self.held(s.id, s.deliveries)
            if row is None:
                continue
            applied.add(s.id)
            if s.outcome is Outcome.DEFER and row.cancel_requested:
                self._archive(row, replace(s, outcome=Outcome.CANCEL, error="cancelled"), now)
            elif s.outcome.archives:
                self._archive(row, s, now)
            elif s.outcome is Outcome.DEFER:
                _defer(row, s, now)
            else:
                _move_back(row, s, now)
        return applied

    def cancel(self, msg_id: int, now: datetime) -> Cancellation:
        row = self.rows.get(msg_id)
        if row is None:
            found = self.archive.get(msg_id)
            if found is None:
                return Cancellation(msg_id, "unknown")
            return Cancellation(msg_id, "archived", found.state)
        if row.state == State.PROCESSING:
            row.cancel_requested = 1
            return Cancellation(msg_id, "requested", State.PROCESSING)
        history = append_history(row.history or [],
                                 history_entry(row.deliveries_count, "cancelled"))
        self._archive(row, Settlement(row.id, row.deliveries_count, Outcome.CANCEL,
                                      error="cancelled", attempted=False, history=history),
                      now)
        return Cancellation(msg_id, "cancelled", State.CANCELLED)

    def _archive(self, row: Row, s: Settlement, now: datetime) -> None:
        self._remove(row)
        if not s.keep:  # the subscriber's archive= deletes this one
            return
        self.archive[row.id] = Archived(
            row.id, row.queue, row.headers, row.payload, s.outcome.value,
            row.attempts_count + int(s.attempted), row.deliveries_count, row.created_at,
            row.first_attempt_at, now if s.attempted else row.last_attempt_at, now, s.error,
            _stamped(s.history, now) if s.history is not None else row.history, row.priority,
            row.channel, s.result if s.outcome is Outcome.COMPLETE else None,
        )

    def extend(self, leases: Sequence[tuple[int, int]], seconds: float,
               now: datetime) -> set[int]:
        kept = set()
        for msg_id, deliveries in leases:
            row = self.held(msg_id, deliveries)
            if row is not None:
                row.lease_expires_at = now + timedelta(seconds=seconds)
                kept.add(msg_id)
        return kept

    def landed(self, settlements: Sequence[Settlement]) -> set[int]:
        return {s.id for s in settlements
                if _shows(s, self.archive.get(s.id) or self.rows.get(s.id))}

    def recover(self, limit: int, spread: float, now: datetime) -> list[int]:
        expired = [r for r in self.rows.values() if r.state == State.PROCESSING
                   and r.lease_expires_at is not None and r.lease_expires_at < now]
        out = []
        at = now.isoformat(timespec="microseconds")
        for r in heapq.nsmallest(max(limit, 0), expired, key=lambda r: r.lease_expires_at):
            r.state = State.PENDING
            r.wait_until(now + timedelta(seconds=random.random() * spread))
            r.lease_expires_at = None
            r.last_error = "lease expired"
            entry = {"delivery": r.deliveries_count, "ended": "lease_expired", "at": at}
            r.history = [*(r.history or []), entry][-HISTORY_LIMIT:]
            out.append(r.id)
        return out

    def requeue(self, found: list[Archived], now: datetime) -> int:
        """Back to the table as fresh PENDING messages, keeping id, creation, error, history,
        priority and channel (a channel's message waits as one again, counted against its
        ``max_size``: a full channel refuses them all)."""
        adding = Counter((a.channel, a.queue) for a in found if a.channel is not None)
        turns = {channel: self.channels.admit(channel, queue, n, self.rows.values(), now)
                 for (channel, queue), n in sorted(adding.items())}
        for a in found:
            del self.archive[a.id]
            self.add([Row(a.id, a.queue, a.headers, a.payload, a.created_at,
                          now if a.channel is None else None, last_error=a.error,
                          history=a.history, priority=a.priority, channel=a.channel,
                          channel_due_at=None if a.channel is None else now,
                          fair_key=_requeued_key(turns.get(a.channel), a.priority))])
        return len(found)

    def purge(self, found: list[Archived]) -> int:
        for a in found:
            del self.archive[a.id]
        return len(found)

    def stats(self) -> list[QueueStats]:
        counts: dict[str, dict[str, int]] = {}
        oldest: dict[str, datetime | None] = {}
        for r in self.rows.values():
            c = counts.setdefault(r.queue, {})
            c[r.state] = c.get(r.state, 0) + 1
            first = oldest.get(r.queue)
            # A channel's message waits due by channel_due_at, as the SQL engines count it.
            due = r.next_attempt_at if r.next_attempt_at is not None else r.channel_due_at
            if due is not None and (first is None or due < first):
                first = due
            oldest[r.queue] = first
        for a in self.archive.values():
            c = counts.setdefault(a.queue, {})
            c[a.state] = c.get(a.state, 0) + 1
        return [QueueStats(q, c.get(State.PENDING, 0), c.get(State.PROCESSING, 0),
                           c.get(State.RETRYABLE, 0), c.get(State.COMPLETED, 0),
                           c.get(State.FAILED, 0), oldest.get(q), c.get(State.EXPIRED, 0),
                           c.get(State.CANCELLED, 0))
                for q, c in sorted(counts.items())]


def _take(r: Row, scheduled: datetime | None, lease: float, now: datetime) -> Delivery:
    """Acquire row ``r`` (taken off its wait by the caller), as the SQL engines' take."""
    r.state = State.PROCESSING
    r.deliveries_count += 1
    r.acquired_at = now
    r.first_attempt_at = r.first_attempt_at or now
    r.lease_expires_at = now + timedelta(seconds=lease)
    return _delivery(r, scheduled)


def _delivery(r: Row, scheduled: datetime | None) -> Delivery:
    assert r.acquired_at is not None and r.lease_expires_at is not None
    return Delivery(r.id, r.queue, dict(r.headers), r.payload, r.attempts_count,
                    r.deliveries_count, r.created_at, r.first_attempt_at, r.acquired_at,
                    r.lease_expires_at, scheduled, _copy(r.history) or [], priority=r.priority,
                    expires_at=r.expires_at, saved_state=r.saved_state, defers=r.defers_count,
                    cancel_requested=bool(r.cancel_requested), channel=r.channel)


def _defer(row: Row, s: Settlement, now: datetime) -> None:
    """DEFER, as the SQL engines' statement writes it (sqlmq.engines.sql.control): back to
    PENDING until ``at`` or after ``delay``, the state saved, one more defer counted."""
    row.state = State.PENDING
    row.wait_until(now + timedelta(seconds=s.delay) if s.at is None
                   else s.at.astimezone(UTC))
    row.lease_expires_at = None
    row.saved_state = s.saved_state
    row.waits_for = s.waits_for
    row.defers_count += 1
    if s.history is not None:
        row.history = _stamped(s.history, now)


def _move_back(row: Row, s: Settlement, now: datetime) -> None:
    """RETRY (to RETRYABLE) or RELEASE (to PENDING), as the SQL engines' settle writes it:
    a refund gives the delivery back, and a refunded first delivery leaves no times."""
    refund = int(s.refund)
    row.state = State.RETRYABLE if s.outcome is Outcome.RETRY else State.PENDING
    row.attempts_count += int(s.attempted)
    if row.deliveries_count == refund:
        row.first_attempt_at = None
        row.acquired_at = None
    row.deliveries_count -= refund
    if s.attempted:
        row.last_attempt_at = now
    row.wait_until(now + timedelta(seconds=s.delay))
    row.lease_expires_at = None
    if s.error is not None:
        row.last_error = s.error
    if s.history is not None:
        row.history = _stamped(s.history, now)


def _shows(s: Settlement, row: Row | Archived | None) -> bool:
    """Whether ``row`` (the archive's, else the table's) is what settlement ``s`` leaves
    (see the SQL engines' ``landed``)."""
    if row is None:  # deleted instead of archived (archive=), as the SQL engines read it
        return not s.keep and (s.outcome.archives or s.outcome is Outcome.DEFER)
    if isinstance(row, Archived):
        return row.deliveries_count == s.deliveries and (row.state == s.outcome.value or (
            s.outcome is Outcome.DEFER and row.state == State.CANCELLED))
    if s.outcome.archives:
        return False
    if s.outcome is Outcome.DEFER:
        return (row.state == State.PENDING and row.lease_expires_at is None
                and row.deliveries_count == s.deliveries
                and records_ending((row.history or [{}])[-1], s.deliveries, "deferred"))
    if s.outcome is Outcome.RETRY:
        return row.state == State.RETRYABLE and row.deliveries_count == s.deliveries
    if row.state != State.PENDING or getattr(row, "lease_expires_at", None) is not None:
        return False
    if s.refund:
        return row.deliveries_count == s.deliveries - 1
    last = (row.history or [{}])[-1]
    recovered = last.get("ended") == "lease_expired" and last.get("delivery") == s.deliveries
    return row.deliveries_count == s.deliveries and not recovered


def _requeued_key(turns: Turns | None, priority: int) -> int | None:
    """A requeued message's key: its channel's first turn for the requeue (None: outside
    the fair order)."""
    return None if turns is None else turns.key(priority)


class MemoryEngine(MemorySchedules, MemoryInsights, MemoryBrowsing, MemoryOperations,
                   MemoryChannelAdmin, MemoryResults, MemoryWorkflowCalls):
    """The engine contract in this process's memory, thread-safe (``publish_sync`` may run
    on another thread than the subscribers' loop)."""

    hands_over = True

    def __init__(self, schema: Schema, clock: Clock | None = None) -> None:
        self.schema = schema
        #: The database clock without :meth:`advance`'s offset: replace it to freeze time.
        self.clock: Clock = clock or real_time
        self._offset = timedelta()
        self._store = MemoryStore()
        self._workflows = MemoryWorkflows()
        self._lock = threading.Lock()
        self._writes = 0  # what commit_counter() reads: bumped by every change

    # ---- the clock ----------------------------------------------------------------------

    def _now(self) -> datetime:
        return self.clock() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the database clock forward: delays, leases and retry delays fall due as if
        that time had passed. Counts as a change, so an idle subscriber looks again soon."""
        with self._lock:
            self._offset += timedelta(seconds=seconds)
            self._writes += 1

    async def now(self) -> datetime:
        with self._lock:
            return self._now()

    # ---- publishing ---------------------------------------------------------------------

    async def publish(self, messages: NewMessages,
                      executor: AsyncConnection | AsyncSession | None = None) -> list[int]:
        await begin_callers(executor)
        return self.publish_sync(messages, executor)

    def publish_sync(self, messages: NewMessages,
                     executor: Connection | Session | AsyncConnection | AsyncSession | None = None,
                     ) -> list[int]:
        """With ``executor``, the ids are taken now and the messages appear when the
        caller's transaction commits (and never, if it rolls back), as rows inserted in it
        would. Unlike rows, they are not taken back by rolling back a savepoint."""
        return self._publish(lambda: [messages], executor)[0]

    async def publish_topic(self, topic: str, messages: NewMessages,
                            executor: AsyncConnection | AsyncSession | None = None,
                            ) -> dict[str, list[int]]:
        await begin_callers(executor)
        return self.publish_topic_sync(topic, messages, executor)

    def publish_topic_sync(self, topic: str, messages: NewMessages,
                           executor: Connection | Session | AsyncConnection | AsyncSession
                           | None = None) -> dict[str, list[int]]:
        """A copy of ``messages`` per group whose pattern matches ``topic``, all at once."""
        queues: list[str] = []

        def copies() -> list[NewMessages]:  # read under the lock, with the groups
            groups = self._store.groups.values()
            queues.extend(queues_for(topic, [(g.pattern, g.queue) for g in groups]))
            return [replace(messages, queue=q) for q in queues]

        return dict(zip(queues, self._publish(copies, executor), strict=True))

    def _publish(self, batches: Callable[[], list[NewMessages]],
                 executor: Connection | Session | AsyncConnection | AsyncSession | None,
                 ) -> list[list[int]]:
        """Publish what ``batches()`` (called under the lock) returns, all in one go."""
        target = None if executor is None else transaction_owner(executor)
        with self._lock:
            now = self._now()
            made = [self._store.new_rows(b, now) for b in batches()]
            rows = [row for new, _ in made for row in new]
            if target is None:
                self._store.add(rows)
                self._writes += 1
        if target is not None:  # a key of its own
            on_commit(target, object(), lambda: self._commit(rows),
                      lambda: self._rolled_back(rows))
        return [ids for _, ids in made]

    def _commit(self, rows: list[Row]) -> None:
        with self._lock:
            self._store.add(rows)
            self._writes += 1

    def _rolled_back(self, rows: list[Row]) -> None:
        with self._lock:
            self._store.free_keys(rows)

    async def publish_leased(self, message: NewMessage, lease: float) -> Delivery | None:
        with self._lock:
            if message.queue in self._store.paused:
                return None  # an acquire would not take it
            now = self._now()
            (row,), _ = self._store.new_rows(NewMessages.of([message]), now)
            row.state, row.deliveries_count, row.next_attempt_at = State.PROCESSING, 1, None
            row.first_attempt_at = row.acquired_at = now
            row.lease_expires_at = now + timedelta(seconds=lease)
            self._store.add([row])
            self._writes += 1
            return _delivery(row, now)

    # ---- topics -------------------------------------------------------------------------

    async def join_group(self, pattern: str, group: str) -> TopicGroup:
        queue = group_queue(pattern, group)
        with self._lock:
            found = self._store.groups.get(queue)
            if found is None:
                found = self._store.groups[queue] = TopicGroup(pattern, group, queue,
                                                                 self._now())
            return found

    async def delete_group(self, pattern: str, group: str) -> int | None:
        queue = group_queue(pattern, group)
        with self._lock:
            if self._store.groups.pop(queue, None) is None:
                return None
            return self._store.drop_queue(queue)

    async def topic_groups(self) -> list[TopicGroup]:
        with self._lock:
            return sorted(self._store.groups.values(), key=lambda g: (g.pattern, g.group))

    # ---- consuming ----------------------------------------------------------------------

    async def acquire(self, queues: Sequence[str], limit: int, lease: float) -> list[Delivery]:
        with self._lock:
            out = self._store.acquire(queues, limit, lease, self._now())
            self._writes += bool(out)
            return out

    def channel_start_in(self, queues: Sequence[str]) -> float | None:
        with self._lock:
            at = self._store.channels.rate_waits.get(tuple(queues))
            return None if at is None else max(0.0, (at - self._now()).total_seconds())

    async def settle(self, settlements: Sequence[Settlement]) -> set[int]:
        """Settle, and publish the outputs of the settlements that land (a pipeline step's:
        see :mod:`sqlmq.engines.sql.settle_onward`), all at once."""
        return (await self.settle_passing(settlements, {}, (), 0, 0))[0]

    async def settle_passing(self, settlements: Sequence[Settlement],
                             slots: Mapping[int, str], queues: Sequence[str], lease: float,
                             most: int) -> tuple[set[int], list[Delivery]]:
        with self._lock:
            now, store = self._now(), self._store
            settlements = self._signals_waited(settlements)
            applied = store.settle(settlements, now)
            for batch in outputs_of(settlements, applied):
                store.add(store.new_rows(batch, now)[0])
            self._steps_settled(settlements, applied, now)
            self._writes += bool(applied)
            freed = freed_slots(applied, slots)
            return applied, store.channels.pass_slots(
                store.rows.values(), freed, [q for q in queues if q not in store.paused],
                most, now, lambda r, scheduled: _take(r, scheduled, lease, now)) if freed else []

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        with self._lock:
            kept = self._store.extend(leases, seconds, self._now())
            self._writes += bool(kept)
            return kept

    async def landed(self, settlements: Sequence[Settlement]) -> set[int]:
        with self._lock:
            return self._store.landed(settlements)

    async def whereabouts(self, ids: Sequence[int]) -> dict[int, Whereabouts]:
        with self._lock:
            rows, archive = self._store.rows, self._store.archive
            found = (rows.get(i) or archive.get(i) for i in ids)
            return {r.id: Whereabouts(str(r.state), r.deliveries_count) for r in found if r}

    # ---- channels -----------------------------------------------------------------------

    async def cancel(self, msg_id: int) -> Cancellation:
        with self._lock:
            found = self._store.cancel(msg_id, self._now())
            if found.outcome == "cancelled":  # what waits on it, if it is a step
                self._workflows.cancelled(self._store, msg_id, self._now())
            self._writes += found.outcome in ("cancelled", "requested")
            return found

    async def cancel_requests(self, ids: Sequence[int]) -> set[int]:
        with self._lock:
            rows = self._store.rows
            return {i for i in ids if i in rows and rows[i].cancel_requested}

    def commit_counter(self) -> Callable[[], int | None] | None:
        return self._read_writes

    def deadlock_victim(self, exc: BaseException) -> bool:
        return False  # one lock, taken alone: nothing to deadlock on

    def _read_writes(self) -> int:
        return self._writes

    def wake_source(self, on_queue: Callable[[str], None],
                    on_all: Callable[[], None]) -> None:
        return None  # publishes in this process wake subscribers through the broker

    def dead_letter_source(self, on_dead: Callable[[DeadLetterNotice], None],
                           on_connect: Callable[[], None]) -> None:
        return None  # the broker's on_dead_letter hooks hear of this process's dead letters

    # ---- maintenance and insights -------------------------------------------------------

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        with self._lock:
            recovered = self._store.recover(limit, spread, self._now())
            self._writes += bool(recovered)
            return recovered

    async def requeue_archived(self, *, queue: str | None = None,
                               ids: Sequence[int] | None = None,
                               state: str = State.FAILED, limit: int | None = None,
                               matching: ArchiveQuery | None = None) -> int:
        with self._lock:
            picked = self._picked(queue, ids, state, None, limit, matching)
            moved = self._store.requeue(picked, self._now())
            self._workflows.requeued(self._store, [a.id for a in picked], _waiting_row)
            self._writes += bool(moved)
            return moved

    async def purge_archived(self, *, queue: str | None = None, state: str | None = None,
                             before: datetime | None = None, limit: int | None = None,
                             ids: Sequence[int] | None = None,
                             matching: ArchiveQuery | None = None) -> int:
        with self._lock:
            return self._store.purge(self._picked(queue, ids, state, before, limit, matching))

    async def stats(self) -> list[QueueStats]:
        with self._lock:
            return self._store.stats()

    # ---- schema and life ----------------------------------------------------------------

    async def migrate(self) -> int:
        return SCHEMA_VERSION  # what the SQL engines return: the version now in place

    async def check_schema(self, shown_url: str) -> None:
        return None

    async def close(self) -> None:
        return None  # nothing held; the messages stay for the test to inspect


# ---- the caller's transaction ---------------------------------------------------------------



__all__ = ["Archived", "MemoryEngine", "MemoryStore", "Row", "ready_key"]
