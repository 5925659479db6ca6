"""Shared plumbing of the SQL engines: the SQLAlchemy engines they run on (created from the
URL on first use, or the caller's), the publish path
through SQLAlchemy Core (MySQL and SQLite batches, and the caller's transaction there), the
statements off the hot path written once in Core, and the decoding of acquired rows.

The contract itself is :mod:`sqlmq.engines.contract`; only the engines know which database
they talk to.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NoReturn

from sqlalchemy import URL, insert, literal
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

from ...channels import Turns
from ...connect import sync_url
from ...dead_letters import DeadLetterNotice
from ...errors import ConfigurationError
from ...lifecycle import Outcome, State, records_ending
from ...migrate import DatabaseSteps, MigrationLock, check_schema, migrate
from ...records import NewMessage, NewMessages, QueueStats, Settlement, Whereabouts
from ...schema import Schema
from ...sqltime import db_now_plus
from ...views import ArchiveQuery
from ..contract import DeadLetterSource, WakeSource
from ..sqlite.connections import READ_ONLY
from .browse import Browsing
from .channels import ChannelAdmin, ChannelStatements
from .connect import create_async, create_sync, finish_abandoned
from .control import ControlStatements
from .drivers import AsyncDriverConnection, SyncDriverConnection
from .drivers.runs import DriverRuns
from .fair import requeued_key, requeued_order
from .insights import ArchiveInsights, archive_where
from .kept_connections import KeptConnections
from .operations import OperationStatements
from .publish import KEYED_TRIES, Flow, Step, publish_flow, run_flow, run_flow_sync
from .results import ResultStatements
from .room import channel_flow, room_flow
from .schedules import ScheduleRegistry
from .settle_onward import OnwardSettle
from .slots import SlotPassing
from .statements import names_for
from .topics import TopicGroups
from .workflows import WorkflowStatements

log = logging.getLogger("sqlmq")

#: The outcomes that end a message (its row moves to the archive), and those that put it back.
ARCHIVING = frozenset(o for o in Outcome if o.archives)
RETURNING = frozenset(o for o in Outcome if not o.archives)

class SqlEngine(ChannelStatements, SlotPassing, ChannelAdmin, OnwardSettle, ControlStatements,
                ResultStatements, TopicGroups, ScheduleRegistry, ArchiveInsights, Browsing,
                OperationStatements, WorkflowStatements, KeptConnections, DriverRuns):
    """What the three SQL engines share: the SQLAlchemy engines under them, schema and
    life, and publishing through SQLAlchemy Core (see :meth:`_publish_core`).

    ``db`` is the async engine everything but ``publish_sync`` runs on, created from the URL
    on first use unless the caller gave one; ``sync_db`` the same for ``publish_sync``. An
    engine given only a synchronous SQLAlchemy Engine publishes synchronously and does
    nothing else.
    """

    hands_over = False
    #: Lock the archive rows a requeue copies (SQLite's BEGIN IMMEDIATE already serialises).
    LOCK_FOR_REQUEUE = True

    def __init__(self, db: AsyncEngine | None, schema: Schema, *, url: URL | None = None,
                 sync_db: SyncEngine | None = None) -> None:
        super().__init__()
        self.schema = schema
        #: The fields of this engine's statements (see :func:`sqlmq.engines.sql.statements.render`).
        self.names = names_for(schema)
        given = db if db is not None else sync_db
        if url is None and given is None:
            raise ConfigurationError("an engine needs a URL or a SQLAlchemy engine")
        self.url: URL = url if url is not None else given.url  # type: ignore[union-attr]
        self._db = db
        self._sync_db = sync_db
        self._owns_db = db is None
        self._sync_only = db is None and url is None
        #: Names the lock that lets one process at a time recover expired leases.
        self.recovery_lock = f"sqlmq:recover:{schema.prefix}"
        self._rate_waits = {}
        self._fair_spread = {}
        self._clocks = {}

    @property
    def db(self) -> AsyncEngine:
        """The async SQLAlchemy engine (created from the URL on first use)."""
        if self._db is None:
            if self._sync_only:
                raise ConfigurationError(
                    "this broker was given a synchronous Engine: only publish_sync() and "
                    "publish_batch_sync() are available; pass a URL or an AsyncEngine to consume"
                )
            self._db = create_async(self.url)
        return self._db

    @property
    def sync_db(self) -> SyncEngine:
        """The synchronous SQLAlchemy engine ``publish_sync`` runs on (created on first use)."""
        if self._sync_db is None:
            self._sync_db = create_sync(sync_url(self.url))
        return self._sync_db

    # ---- contract defaults ---------------------------------------------------------------

    def commit_counter(self) -> Callable[[], int | None] | None:
        return None  # PostgreSQL has LISTEN; MySQL nothing as cheap as its acquire

    def wake_source(self, on_queue: Callable[[str], None],
                    on_all: Callable[[], None]) -> WakeSource | None:
        return None

    def dead_letter_source(self, on_dead: Callable[[DeadLetterNotice], None],
                           on_connect: Callable[[], None]) -> DeadLetterSource | None:
        return None  # PostgreSQL's NOTIFY; elsewhere the archive is polled

    def answer_source(self, on_ended: Callable[[list[int]], None],
                      on_connect: Callable[[], None]) -> WakeSource | None:
        return None  # PostgreSQL's NOTIFY; elsewhere waiters poll or watch commits

    async def publish_leased(self, message: NewMessage, lease: float) -> NoReturn:
        raise NotImplementedError(f"{type(self).__name__} does not hand publishes over")

    def _migration_lock(self, conn: Connection) -> Callable[[], None] | None:
        """Take the lock that makes concurrent migrators of this prefix take turns, in
        ``conn``'s transaction; returns what releases it, if it outlives the transaction."""
        return None

    def database_steps(self) -> DatabaseSteps:
        """What this database does at a version beyond the steps every database shares
        (see :data:`sqlmq.migrate.DatabaseSteps`)."""
        return {}

    async def migrate(self) -> int:
        lock: MigrationLock = self._migration_lock
        return await migrate(self.db, self.schema, lock, self.database_steps())

    async def check_schema(self, shown_url: str) -> None:
        await check_schema(self.db, self.schema, shown_url)

    async def close(self) -> None:
        """Return the kept connections, and dispose of the SQLAlchemy engines sqlmq made
        (a later call makes new ones: the broker may start again)."""
        await self._close_lookouts()
        await self._close_kept()
        await finish_abandoned()
        if self._owns_db and self._db is not None:
            await self._db.dispose()
            self._db = None
            self._kept_closed = False
        if self._sync_db is not None:
            self._sync_db.dispose()

    # ---- publishing through SQLAlchemy Core ----------------------------------------------

    async def _publish_core(
        self, messages: NewMessages,
        executor: AsyncConnection | AsyncSession | AsyncDriverConnection | None,
    ) -> list[int]:
        """Insert ``messages`` in ``executor``'s transaction, or in one of sqlmq's own (see
        :mod:`.publish`)."""
        return await self._run_core(  # type: ignore[no-any-return]
            self._publish_flow(messages), messages, executor)

    def publish_sync(
        self, messages: NewMessages,
        executor: Connection | Session | SyncDriverConnection | None = None,
    ) -> list[int]:
        return self._run_core_sync(  # type: ignore[no-any-return]
            self._publish_flow(messages), messages, executor)

    def _publish_flow(self, messages: NewMessages) -> Callable[[Dialect], Flow]:
        """The Core publish of ``messages``, for a connection's dialect."""
        if messages.channel is not None:
            self._saw_channels()
            return lambda dialect: channel_flow(self.schema, dialect, messages,
                                                self._wake_statement(messages),
                                                self._saw_free_channel)
        return lambda dialect: publish_flow(self.schema.message, dialect, messages,
                                            self._wake_statement(messages))

    async def _run_core(
        self, make_flow: Callable[[Dialect], Flow], messages: NewMessages,
        executor: AsyncConnection | AsyncSession | AsyncDriverConnection | None,
    ) -> Any:
        """Run the flow ``make_flow`` gives for the connection's dialect, publishing
        ``messages``, in ``executor``'s transaction (a SQLAlchemy connection's or session's,
        or the caller's driver connection's: :mod:`.drivers`) or in one of sqlmq's own (run
        again if the database picks it as a deadlock's victim: :meth:`_run_again`)."""
        if isinstance(executor, AsyncDriverConnection):
            return await self._run_on_driver(executor, make_flow)
        if executor is None:
            for tries in range(1, KEYED_TRIES + 1):
                try:
                    async with self.db.begin() as conn:
                        return await run_flow(conn, make_flow(conn.dialect))
                except DBAPIError as exc:
                    if not self._run_again(messages, exc, tries):
                        raise
        if isinstance(executor, AsyncSession):
            executor = await executor.connection()
        return await run_flow(executor, make_flow(executor.dialect))

    def _run_core_sync(
        self, make_flow: Callable[[Dialect], Flow], messages: NewMessages,
        executor: Connection | Session | SyncDriverConnection | None,
    ) -> Any:
        """The same on a synchronous connection."""
        if isinstance(executor, SyncDriverConnection):
            return self._run_on_driver_sync(executor, make_flow)
        if executor is None:
            for tries in range(1, KEYED_TRIES + 1):
                try:
                    with self.sync_db.begin() as conn:
                        return run_flow_sync(conn, make_flow(conn.dialect))
                except DBAPIError as exc:
                    if not self._run_again(messages, exc, tries):
                        raise
        if isinstance(executor, Session):
            executor = executor.connection()
        return run_flow_sync(executor, make_flow(executor.dialect))

    def _run_again(self, messages: NewMessages, exc: DBAPIError, tries: int) -> bool:
        """Whether a publish in sqlmq's own transaction that failed with ``exc`` runs again:
        one the database chose as a deadlock's victim, up to ``KEYED_TRIES`` times. The
        database rolled it back, so it wrote nothing, and run again it is the same. Keyed
        publishes meet deadlocks most (see :mod:`.publish`), but a plain or topic
        publish's insert can be chosen too, against the acquires and settles of a busy
        MariaDB (a topic publish failed so in ``test_topics`` under the full suite)."""
        if tries >= KEYED_TRIES or not self.deadlock_victim(exc):
            return False
        log.info("a publish to %r was a deadlock's victim; running it again (%d of %d)",
                 messages.queue, tries + 1, KEYED_TRIES)
        return True

    def deadlock_victim(self, exc: BaseException) -> bool:
        """Whether the database ended the transaction to break a deadlock (``exc`` as
        SQLAlchemy wrapped it, or as the driver raised it)."""
        return False

    def _wake_statement(self, messages: NewMessages) -> Step | None:
        """What a Core publish runs to wake consumers in other processes (PostgreSQL's
        NOTIFY); None where they notice commits by themselves."""
        return None

    def _dead_letter_statement(self, msg_id: int, deliveries: int | None,
                               state: str) -> Executable | None:
        """What the Core statements that archive message ``msg_id`` as ``state`` (a dead
        letter: CANCELLED) run first, in their transaction, while its row is still in the
        table and locked (and has delivery ``deliveries``, if given): PostgreSQL's NOTIFY on
        the dead-letter channel; None where nothing is pushed."""
        return None

    @staticmethod
    def settlement_json(settlements: Sequence[Settlement]) -> str:
        """The batch as one JSON array parameter (for JSON_TABLE / json_each)."""
        return json.dumps(
            [
                [
                    s.id,
                    s.deliveries,
                    s.outcome.value,
                    s.error,
                    s.delay,
                    1 if s.refund else 0,
                    1 if s.attempted else 0,
                    None if s.history is None else json.dumps(s.history),
                    1 if s.keep else 0,
                ]
                for s in settlements
            ]
        )


def _as_json(value: Any) -> Any:
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value


#: Archived ids per statement of a requeue (its channel count, its copy and its delete).
REQUEUE_CHUNK = 500


class ArchiveAndStatsMixin:
    """Statements off the hot path, written once in SQLAlchemy Core for every database."""

    db: AsyncEngine
    schema: Schema
    LOCK_FOR_REQUEUE: bool

    async def now(self) -> datetime:
        from sqlalchemy import select

        async with self.db.connect() as conn:
            await conn.execution_options(**{READ_ONLY: True})
            return (await conn.execute(select(db_now_plus(literal(0.0))))).scalar_one()

    def _archive_filter(
        self, queue: str | None, ids: Sequence[int] | None, state: str | None,
        before: datetime | None, matching: ArchiveQuery | None = None,
    ) -> list[Any]:
        a = self.schema.archive
        where: list[Any] = [] if matching is None else archive_where(a, matching)
        if queue is not None:
            where.append(a.c.queue == queue)
        if ids is not None:
            where.append(a.c.id.in_(list(ids)))
        if state is not None:
            where.append(a.c.state == state)
        if before is not None:
            where.append(a.c.archived_at < before)
        return where

    async def landed(self, settlements: Sequence[Settlement]) -> set[int]:
        from sqlalchemy import select

        a, m = self.schema.archive, self.schema.message
        ended = [s.id for s in settlements if s.outcome in ARCHIVING or
                 s.outcome is Outcome.DEFER]  # a defer of a cancelled message archives it
        back = [s.id for s in settlements if s.outcome not in ARCHIVING or not s.keep]
        async with self.db.connect() as conn:
            await conn.execution_options(**{READ_ONLY: True})
            archived = {r.id: r for r in await conn.execute(
                select(a.c.id, a.c.state, a.c.deliveries_count).where(a.c.id.in_(ended))
            )} if ended else {}
            queued = {r.id: r for r in await conn.execute(
                select(m.c.id, m.c.state, m.c.deliveries_count, m.c.lease_expires_at,
                       m.c.history).where(m.c.id.in_(back))
            )} if back else {}
        return {s.id for s in settlements
                if _shows(s, archived.get(s.id), queued.get(s.id))}

    async def whereabouts(self, ids: Sequence[int]) -> dict[int, Whereabouts]:
        from sqlalchemy import select

        a, m = self.schema.archive, self.schema.message
        found: dict[int, Whereabouts] = {}
        async with self.db.connect() as conn:
            await conn.execution_options(**{READ_ONLY: True})
            for t in (a, m):  # the table's read last: a requeue committed between wins
                found.update((r.id, Whereabouts(r.state, r.deliveries_count))
                             for r in await conn.execute(select(
                                 t.c.id, t.c.state, t.c.deliveries_count).where(
                                     t.c.id.in_(list(ids)))))
        return found

    async def requeue_archived(
        self, *, queue: str | None = None, ids: Sequence[int] | None = None,
        state: str = State.FAILED.value, limit: int | None = None,
        matching: ArchiveQuery | None = None,
    ) -> int:
        from sqlalchemy import case, delete, select

        a, m = self.schema.archive, self.schema.message
        where = self._archive_filter(queue, ids, state, None, matching)
        async with self.db.begin() as conn:
            # Lock the archive rows first so a concurrent requeue cannot copy them twice.
            locked = select(a.c.id).where(*where)
            if limit is not None:
                locked = locked.order_by(a.c.id).limit(limit)
            if self.LOCK_FOR_REQUEUE:
                locked = locked.with_for_update()
            picked = list((await conn.execute(locked)).scalars())
            if not picked:
                return 0
            turns = await self._room_for_requeue(conn, picked)
            moved = 0
            for start in range(0, len(picked), REQUEUE_CHUNK):
                chunk = picked[start : start + REQUEUE_CHUNK]
                # A channel's message waits as one again: due by channel_due_at, its
                # next_attempt_at NULL (see sqlmq.channels).
                now = db_now_plus(literal(0.0))
                src = select(
                    a.c.id, a.c.queue, a.c.headers, a.c.payload, literal(State.PENDING.value),
                    literal(0), literal(0), a.c.created_at,
                    case((a.c.channel.is_(None), now)), a.c.error, a.c.history, a.c.priority,
                    a.c.channel, case((a.c.channel.is_not(None), now)),
                    requeued_key(a, turns), requeued_order(a, turns),
                ).where(a.c.id.in_(chunk))
                await conn.execute(
                    insert(m).from_select(
                        ["id", "queue", "headers", "payload", "state", "attempts_count",
                         "deliveries_count", "created_at", "next_attempt_at", "last_error",
                         "history", "priority", "channel", "channel_due_at", "fair_key",
                         "ordered"],
                        src,
                    )
                )
                moved += (await conn.execute(delete(a).where(a.c.id.in_(chunk)))).rowcount
            await self._steps_requeued(conn, picked)  # what their failure cancelled waits again
            return moved

    async def _room_for_requeue(self, conn: AsyncConnection,
                                picked: list[int]) -> dict[str, Turns]:
        """Make room for the channel messages among ``picked`` as a publish does (the
        channel's row locked, its ``max_size`` checked), channel by channel in name order
        so two requeues lock them alike: a full channel refuses the whole batch with
        :class:`~sqlmq.errors.ChannelFull`, and its transaction rolls back. Returns the
        turns of each channel without limits for them (they share the first: a requeue
        is an operator's batch; in an ordered channel, their ids order them)."""
        from sqlalchemy import func, select

        a = self.schema.archive
        adding: dict[tuple[str, str], int] = {}
        for start in range(0, len(picked), REQUEUE_CHUNK):
            chunk = picked[start : start + REQUEUE_CHUNK]
            for channel, queue, n in await conn.execute(
                    select(a.c.channel, a.c.queue, func.count())
                    .where(a.c.id.in_(chunk), a.c.channel.is_not(None))
                    .group_by(a.c.channel, a.c.queue)):
                adding[channel, queue] = adding.get((channel, queue), 0) + n
        turns: dict[str, Turns] = {}
        for (channel, queue), n in sorted(adding.items()):
            given = await run_flow(conn, room_flow(self.schema, conn.dialect, channel, queue, n))
            if given is not None:  # None: a channel with limits, outside the fair order
                turns[channel] = given
        return turns

    async def purge_archived(
        self, *, queue: str | None = None, state: str | None = None,
        before: datetime | None = None, limit: int | None = None,
        ids: Sequence[int] | None = None, matching: ArchiveQuery | None = None,
    ) -> int:
        from sqlalchemy import delete, select

        a = self.schema.archive
        where = self._archive_filter(queue, ids, state, before, matching)
        async with self.db.begin() as conn:
            if limit is None:
                return (await conn.execute(delete(a).where(*where))).rowcount
            # MySQL takes no LIMIT in an IN subquery of the table it deletes from: pick the
            # batch first, in the same transaction.
            picked = select(a.c.id).where(*where).order_by(a.c.id).limit(limit)
            if self.LOCK_FOR_REQUEUE:
                picked = picked.with_for_update()
            ids = list((await conn.execute(picked)).scalars())
            if not ids:
                return 0
            return (await conn.execute(delete(a).where(a.c.id.in_(ids)))).rowcount

    async def stats(self) -> list[QueueStats]:
        from sqlalchemy import func, select

        m, a = self.schema.message, self.schema.archive
        counts: dict[str, dict[str, Any]] = {}
        async with self.db.connect() as conn:
            await conn.execution_options(**{READ_ONLY: True})
            # A channel's message waits due by channel_due_at, its next_attempt_at NULL;
            # a running one has both NULL.
            due = func.coalesce(m.c.next_attempt_at, m.c.channel_due_at)
            live = await conn.execute(
                select(m.c.queue, m.c.state, func.count(), func.min(due))
                .group_by(m.c.queue, m.c.state)
            )
            for queue, state, n, oldest in live:
                q = counts.setdefault(queue, {"oldest": None})
                q[state] = n
                if oldest is not None and (q["oldest"] is None or oldest < q["oldest"]):
                    q["oldest"] = oldest
            done = await conn.execute(
                select(a.c.queue, a.c.state, func.count()).group_by(a.c.queue, a.c.state)
            )
            for queue, state, n in done:
                counts.setdefault(queue, {"oldest": None})[state] = n
        return [
            QueueStats(
                queue=q,
                pending=c.get(State.PENDING, 0),
                processing=c.get(State.PROCESSING, 0),
                retryable=c.get(State.RETRYABLE, 0),
                completed=c.get(State.COMPLETED, 0),
                failed=c.get(State.FAILED, 0),
                oldest_ready_at=c["oldest"],
                expired=c.get(State.EXPIRED, 0),
                cancelled=c.get(State.CANCELLED, 0),
            )
            for q, c in sorted(counts.items())
        ]


def _shows(s: Settlement, archived: Any, row: Any) -> bool:
    """Whether the archive row ``archived`` or the message row ``row`` (None: no such row)
    is what settlement ``s`` leaves. Only the holder of delivery ``(id, deliveries)`` can
    write it: an archive row (CANCELLED for a defer of a message cancelled meanwhile) or a
    RETRYABLE row with that delivery number; for a defer, PENDING at that delivery with the
    ``deferred`` entry last; for a refunded release, PENDING one delivery back (a lease
    recovery never refunds); for another release, PENDING at that delivery without the
    ``lease_expired`` entry a recovery would have added."""
    if archived is not None:
        return bool(archived.deliveries_count == s.deliveries and (
            archived.state == s.outcome.value
            or (s.outcome is Outcome.DEFER and archived.state == State.CANCELLED)))
    if row is None:
        # Deleted instead of archived (archive="failed"/"none"): gone is all it leaves. A
        # later delivery's settle, after a recovery, would leave the same, so a result
        # whose reply was lost may count as landed when it was stale: both ended the same.
        return not s.keep and (s.outcome in ARCHIVING or s.outcome is Outcome.DEFER)
    if s.outcome in ARCHIVING:
        return False
    if s.outcome is Outcome.DEFER:
        last = (_as_json(row.history) or [{}])[-1]
        return bool(row.state == State.PENDING and row.lease_expires_at is None
                    and row.deliveries_count == s.deliveries
                    and records_ending(last, s.deliveries, "deferred"))
    if s.outcome is Outcome.RETRY:
        return bool(row.state == State.RETRYABLE and row.deliveries_count == s.deliveries)
    if row.state != State.PENDING or row.lease_expires_at is not None:
        return False
    if s.refund:
        return bool(row.deliveries_count == s.deliveries - 1)
    last = (_as_json(row.history) or [{}])[-1]
    recovered = isinstance(last, dict) and last.get("ended") == "lease_expired" and \
        last.get("delivery") == s.deliveries
    return bool(row.deliveries_count == s.deliveries and not recovered)
