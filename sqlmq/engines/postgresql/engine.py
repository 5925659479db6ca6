"""PostgreSQL: acquire and settle are one statement each (CTEs, arrays via ``unnest``); a
publish is one statement (or a binary COPY from ``PG_COPY_MIN`` rows) that also sends the
NOTIFY waking consumers in other processes, or, overlapping another publish, leaves it to one
sent after its commit (:mod:`.wakes`). The statements are in
:mod:`sqlmq.engines.postgresql.statements`.

The hot path (acquire, settle, publish) goes straight to asyncpg on kept connections:
statements prepared once per connection, rows read without SQLAlchemy's per-row processing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import bindparam, func, literal, literal_column, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

from ...backoff import describe
from ...dead_letters import DeadLetterNotice
from ...errors import PublishOutcomeUnknown
from ...lifecycle import Outcome
from ...records import Delivery, NewMessages, Settlement
from ..contract import DeadLetterSource, WakeSource
from ..sql.drivers import AsyncDriverConnection, SyncDriverConnection
from ..sql.engine import ArchiveAndStatsMixin, SqlEngine
from ..sql.kept_connections import discard, driver_connection
from ..sql.publish import Step
from ..sql.rows import BatchHeaders, BatchTimes, decode_history, decode_rows, undecodable_delivery
from ..sql.settle_onward import needs_onward
from ..sql.statements import channel_fields, render
from . import statements as sql
from .copy_publish import PG_COPY_COLUMNS, PG_COPY_MIN, insert_args, pg_copy_args, pg_copy_data
from .errors import connection_lost, deadlock_detected, from_driver, never_sent
from .floors import ReadyFloors
from .notify import DeadLetterListener, Listener, channel_for, dead_letter_channel
from .outbox import CallersInsert
from .results import PgResults
from .search import PgSearch
from .wakes import PublishWakes

_PLANNED = "sqlmq_index_plans"  # the key in a connection's info while INDEX_PLANS_ON holds

#: Tries of a statement whose connection turns out dead before anything reached the server
#: (see never_sent): when the server restarts or an administrator ends sqlmq's sessions,
#: the first try fails on a kept connection and hands the others back to the pool
#: (KeptConnections._discard), whose pre-ping replaces the dead ones for the next.
_SEND_TRIES = 4
#: A Core publish's NOTIFY (see _wake_statement).
_NOTIFY = select(func.pg_notify(bindparam("p_channel"), bindparam("p_queue")))

T = TypeVar("T")
log = logging.getLogger("sqlmq")


class PgConnections(SqlEngine):
    """How the PostgreSQL engine talks to the server: statements straight on asyncpg over
    kept connections (retried when the connection died before they were sent), the COPY
    transaction, and transactions through SQLAlchemy for the rest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reserve: str | None = None  # COPY_RESERVE, once the id sequence is known
        self._can_copy = True  # False once the id column turns out to have no sequence

    def _disconnection(self, exc: Exception) -> bool:
        """asyncpg's own errors, which reach here unwrapped and which SQLAlchemy's dialect
        does not judge, as well as the server's word for a session it ended."""
        return never_sent(exc) or connection_lost(exc)

    async def _copy(self, messages: NewMessages, channel: str) -> list[int] | None:
        """One transaction: reserve the ids, read the clock and queue the NOTIFY in one
        statement, COPY the rows, COMMIT. None when the table has no id sequence to reserve
        from (the caller inserts instead). A connection lost before the COMMIT was sent
        wrote nothing (the server rolls the transaction back): it all runs again on another
        connection. Other errors come out as SQLAlchemy's, like those of the INSERT path."""
        for attempt in range(1, _SEND_TRIES + 1):
            conn: AsyncConnection | None = None
            stage = ["connect"]
            try:
                conn = await self._checkout()
                ids = await self._copy_on(await driver_connection(conn), messages, channel,
                                          stage)
            except Exception as exc:
                if conn is not None:
                    await self._discard(conn, exc)
                lost = never_sent(exc) or connection_lost(exc)
                if lost and stage[0] == "COMMIT" and not never_sent(exc):
                    raise _publish_unknown(messages, exc) from exc
                if lost and (conn is not None or never_sent(exc)) and attempt < _SEND_TRIES:
                    _log_discarded(exc)
                    continue
                raise self._translated(exc, stage[0]) from exc
            except BaseException:
                if conn is not None:
                    await self._drop(conn)
                raise
            if ids is None:
                self._can_copy = False
            await self._checkin(conn)
            return ids
        raise AssertionError("unreachable")  # pragma: no cover

    async def _copy_on(self, raw: Any, messages: NewMessages, channel: str,
                       stage: list[str]) -> list[int] | None:
        """The COPY transaction on one driver connection; ``stage[0]`` names the statement
        in progress (``COMMIT`` last)."""
        stage[0] = sql.COPY_SEQUENCE
        if self._reserve is None:
            sequence = await raw.fetchval(sql.COPY_SEQUENCE, self.schema.message.name)
            if sequence is None:
                return None
            # spliced as a literal, so that it resolves once, at parse time
            self._reserve = render(sql.COPY_RESERVE,
                                   {"sequence": "'" + sequence.replace("'", "''") + "'"})
        transaction = raw.transaction()
        stage[0] = "BEGIN"
        await transaction.start()
        stage[0] = self._reserve
        row = await raw.fetchrow(self._reserve, *pg_copy_args(channel, messages))
        created_at, next_attempt_at, ids, expires_at = row[0], row[1], sorted(row[2]), row[4]
        stage[0] = f"COPY {self.schema.message.name} FROM STDIN (FORMAT binary)"
        await raw.copy_to_table(
            self.schema.message.name, columns=PG_COPY_COLUMNS, format="binary",
            source=pg_copy_data(messages, ids, created_at, next_attempt_at, expires_at),
        )
        stage[0] = "COMMIT"
        await transaction.commit()
        return ids

    async def _fetch(self, statement: str, *args: Any, index_plans: bool = False,
                     unknown: Callable[[Exception], Exception] | None = None) -> list[Any]:
        """One statement straight on asyncpg, in a transaction of its own (autocommit).

        A connection the server closed (a restart, ``pg_terminate_backend``) is an ordinary
        disconnection: it is discarded with one warning line. A statement that had not
        reached the server runs again on another connection; one that had has an unknown
        outcome, and ``unknown`` builds the error to raise then (a publish's). Other errors
        come out wrapped as SQLAlchemy's, like those of every other engine call."""
        for attempt in range(1, _SEND_TRIES + 1):
            conn: AsyncConnection | None = None
            sent = False
            try:
                conn = await self._checkout()
                raw = await driver_connection(conn)
                if index_plans and not conn.info.get(_PLANNED):
                    await raw.execute(sql.INDEX_PLANS_ON)
                    conn.info[_PLANNED] = True
                sent = True
                rows = await raw.fetch(statement, *args)
            except Exception as exc:
                if conn is not None:
                    await self._discard(conn, exc)
                unsent = never_sent(exc) or (
                    conn is not None and not sent and connection_lost(exc))
                if unsent and attempt < _SEND_TRIES:
                    _log_discarded(exc)
                    continue
                if unknown is not None and sent and not unsent and connection_lost(exc):
                    raise unknown(exc) from exc
                raise self._translated(exc, statement) from exc
            except BaseException:
                if conn is not None:
                    await self._drop(conn)
                raise
            await self._checkin(conn)
            return rows
        raise AssertionError("unreachable")  # pragma: no cover

    async def _release(self, conn: AsyncConnection) -> None:
        """A kept connection goes back to the pool: without the planner settings of
        acquire and settle, which are no business of the pool's other users (a user's own
        engine may be shared with the application)."""
        if conn.info.get(_PLANNED):
            try:
                await (await driver_connection(conn)).execute(sql.INDEX_PLANS_OFF)
            except Exception:
                await discard(conn)
                return
            conn.info.pop(_PLANNED, None)
        await conn.close()

    def _translated(self, exc: Exception, statement: str) -> Exception:
        """asyncpg's error (or a socket's) as SQLAlchemy's; anything else as it is."""
        if isinstance(exc, SQLAlchemyError) or not from_driver(exc):
            return exc
        return _as_sqlalchemy_error(exc, statement, self.db.dialect)

    async def _transaction(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``work`` in a transaction of its own, through SQLAlchemy. A pooled connection the
        server closed while it sat idle can fail the pool's pre-ping, or the first
        statement, with an asyncpg error raised before anything was sent, which SQLAlchemy
        passes on untranslated: the connection is dropped and ``work`` runs on another."""
        for attempt in range(1, _SEND_TRIES + 1):
            try:
                async with self.db.begin() as conn:
                    return await work(conn)
            except Exception as exc:
                if never_sent(exc) and attempt < _SEND_TRIES:
                    _log_discarded(exc)
                    continue
                raise self._translated(exc, "") from exc
        raise AssertionError("unreachable")  # pragma: no cover


class PostgresEngine(CallersInsert, PgResults, PgSearch, ArchiveAndStatsMixin, PgConnections):
    """The contract on PostgreSQL."""

    hands_over = False  # a publish wakes listeners at once; an acquire takes it from there
    DATABASE = "postgresql"
    SETTLE_KEEPS_RESULTS = True  # SETTLE writes results and notifies their endings itself

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.channel = channel_for(self.schema)  # NOTIFY's channel, one per table prefix
        #: The channel of the prefix's dead letters (see :mod:`.notify`): a literal in
        #: SETTLE (a prefix is letters, digits and underscores: nothing to escape).
        self.dead_channel = dead_letter_channel(self.schema)
        self.names = names = {**self.names, "dead_channel": f"'{self.dead_channel}'",
                              "result_channel": f"'{self.result_channel}'"}
        self._acquire_one = render(sql.ACQUIRE_ABOVE_FLOORS, names)
        self._sweep_below = render(sql.SWEEP_BELOW_FLOORS, names)
        #: What earlier acquires of each queue proved taken (see :mod:`.floors`).
        self.floors = ReadyFloors()
        self._acquire_many = render(sql.ACQUIRE_QUEUES, names)
        fair = channel_fields(names)
        self._acquire_fair_sql = render(sql.ACQUIRE_FAIR, fair)
        self._settle = render(sql.SETTLE, names)
        self._settle_passing = render(sql.SETTLE_PASSING, fair)
        self._insert = render(sql.INSERT, names)
        self._insert_at = render(sql.INSERT_AT, names)
        self._insert_quiet = render(sql.INSERT_QUIET, names)
        self._insert_at_quiet = render(sql.INSERT_AT_QUIET, names)
        #: Overlapping publishes' wake-ups, sent after their commits (see :mod:`.wakes`).
        self.wakes = PublishWakes(self._wake)
        self._extend = render(sql.EXTEND, names)
        self._recover = render(sql.RECOVER_EXPIRED, names)

    # ---- publishing ----------------------------------------------------------------------

    async def publish(
        self, messages: NewMessages,
        executor: AsyncConnection | AsyncSession | AsyncDriverConnection | None = None,
    ) -> list[int]:
        """Publish a batch: one statement, one round trip, straight on asyncpg like acquire
        and settle (through SQLAlchemy a single publish cost 2.5 times the client CPU, which
        a busy publisher shares with its subscribers); from ``PG_COPY_MIN`` messages on, by
        binary COPY, which costs both sides less per row (see :mod:`.copy_publish`). With
        ``executor``, the same statement in the caller's transaction (:mod:`.outbox`). A
        publish on sqlmq's
        connection while another one is sending its NOTIFY goes without and is woken after
        its commit (:mod:`.wakes`: notifying commits cannot share a WAL flush).

        A connection lost before the publish reached the server, or before its COMMIT was
        sent, wrote nothing: the publish runs again on another connection. Lost after that,
        the outcome is unknown, and :class:`PublishOutcomeUnknown` says so."""
        if messages.core_only:
            return await self._publish_core(messages, executor)
        statement = self._insert if messages.at is None else self._insert_at
        if executor is not None:
            return await self._insert_in(executor, statement, messages)
        if len(messages) >= PG_COPY_MIN and self._can_copy:
            ids = await self._copy(messages, self.channel)
            if ids is not None:
                return ids
        notifying = self.wakes.claim()
        if not notifying:  # another publish is notifying: this one's NOTIFY waits
            statement = self._insert_quiet if messages.at is None else self._insert_at_quiet
        try:
            rows = await self._fetch(statement, *insert_args(self.channel, messages),
                                     unknown=lambda exc: _publish_unknown(messages, exc))
        finally:
            if notifying:
                self.wakes.release()
        if not notifying:
            self.wakes.wake(messages.queue)
        return list(rows[0][0])

    async def _wake(self, queues: list[str]) -> None:
        """The NOTIFY owed to quiet publishes of ``queues`` (see :mod:`.wakes`)."""
        await self._fetch(sql.WAKE, self.channel, queues)

    def publish_sync(
        self, messages: NewMessages,
        executor: Connection | Session | SyncDriverConnection | None = None,
    ) -> list[int]:
        """The same statement on a synchronous connection, sqlmq's own (psycopg) or the
        caller's, whatever its driver (see :mod:`.outbox`). Deduplication keys
        take the Core path (:mod:`..sql.publish`), as do channels (:mod:`..sql.channels`)."""
        if messages.core_only:
            return super().publish_sync(messages, executor)
        if executor is None:
            with self.sync_db.begin() as conn:
                return self.publish_sync(messages, conn)
        statement = self._insert if messages.at is None else self._insert_at
        return self._insert_in_sync(executor, statement, messages)

    def deadlock_victim(self, exc: BaseException) -> bool:
        return deadlock_detected(exc)

    def _wake_statement(self, messages: NewMessages) -> Step | None:
        """The NOTIFY the INSERT statements send, for a publish through Core: it too is
        delivered at the commit, once the rows are visible. One statement, built once."""
        return _NOTIFY, {"p_channel": self.channel, "p_queue": messages.queue}

    def _queue_wake_statement(self, queue: str) -> Executable | None:
        """A resume notifies as a publish does: listeners in every process look at the
        queue at once, when the resume commits."""
        return select(func.pg_notify(self.channel, queue))

    def wake_source(self, on_queue: Callable[[str], None],
                    on_all: Callable[[], None]) -> WakeSource | None:
        """The LISTEN connection on this prefix's channel, which every publish notifies."""
        return Listener(self.db, self.channel, on_queue, on_all)

    def _dead_letter_statement(self, msg_id: int, deliveries: int | None,
                               state: str) -> Executable | None:
        """The dead-letter NOTIFY of row ``msg_id`` about to be archived as ``state``, with
        SETTLE's payload (:data:`~.statements.DEAD_LETTER_PAYLOAD`), delivered when the
        archiving transaction commits."""
        m = self.schema.message
        row = select(m.c.id, m.c.queue, literal(state).label("outcome")).where(m.c.id == msg_id)
        if deliveries is not None:
            row = row.where(m.c.deliveries_count == deliveries)
        return select(func.pg_notify(self.dead_channel,
                                     literal_column(sql.DEAD_LETTER_PAYLOAD))).select_from(
            row.subquery("dead"))

    def dead_letter_source(self, on_dead: Callable[[DeadLetterNotice], None],
                           on_connect: Callable[[], None]) -> DeadLetterSource | None:
        """The LISTEN connection on this prefix's dead-letter channel, which every message
        archived FAILED or CANCELLED notifies."""
        return DeadLetterListener(self.db, self.dead_channel, on_dead, on_connect)

    # ---- consuming -----------------------------------------------------------------------

    async def _acquire_plain(self, queues: Sequence[str], limit: int,
                             lease: float) -> list[Delivery]:
        if len(queues) == 1:
            queue = queues[0]
            levels, floors, version = self.floors.args(queue)
            rows = await self._fetch(self._acquire_one, queue, limit, float(lease), levels,
                                     floors, index_plans=True)
            self.floors.learn(queue, version, rows, limit)
            self.floors.sweep_soon(queue, self._sweep)
        else:
            rows = await self._fetch(self._acquire_many, list(queues), limit, float(lease),
                                     index_plans=True)
        out = _decoded(rows)
        out.sort(key=_schedule_order)
        return out

    async def _acquire_fair(self, queues: Sequence[str], limit: int,
                            lease: float) -> list[Delivery]:
        """As the SQL engines' (:mod:`..sql.fair`), in one statement, decoded as the
        plain acquire's rows are: the generic path spent as long in Python as in its four
        statements."""
        rows = await self._fetch(self._acquire_fair_sql, list(queues), limit, float(lease),
                                 index_plans=True)
        rows.sort(key=lambda r: (r[18], r[0]))
        out = _decoded(rows)
        for d, r in zip(out, rows, strict=True):
            d.channel, d.holds_slot, d.passes_slot = r[17], r[19], r[19]
        self._fair_spread[tuple(queues)] = len({r[17] for r in rows})
        return out

    async def _sweep(self, queue: str, levels: list[int], floors: list[float]) -> list[Any]:
        return await self._fetch(self._sweep_below, queue, levels, floors, index_plans=True)

    async def close(self) -> None:
        await self.wakes.close()
        await self.floors.close()
        await super().close()

    async def _settle_alone(self, settlements: Sequence[Settlement]) -> set[int]:
        if not settlements:
            return set()
        rows = await self._fetch(self._settle, *_settle_args(settlements), index_plans=True)
        return {r[0] for r in rows}

    async def settle_passing(self, settlements: Sequence[Settlement],
                             slots: Mapping[int, str], queues: Sequence[str], lease: float,
                             most: int) -> tuple[set[int], list[Delivery]]:
        """As the SQL engines' (:mod:`..sql.slots`), in one statement (SETTLE_PASSING)
        for a batch without outputs or control results, as the settle alone is."""
        if needs_onward(settlements, results=False):
            return await super().settle_passing(settlements, slots, queues, lease, most)
        rows = await self._fetch(self._settle_passing, *_settle_args(settlements),
                                 _texts(slots.get(s.id) for s in settlements), list(queues),
                                 float(lease), most, index_plans=True)
        applied = set(rows[0][0] or ())
        taken = [r[1:] for r in rows if r[1] is not None]
        out = _decoded(taken)
        for d, r in zip(out, taken, strict=True):
            d.channel, d.holds_slot, d.passes_slot = r[17], True, True
        out.sort(key=_schedule_order)
        return applied, out

    async def _settle_in(self, conn: AsyncConnection,
                         settlements: Sequence[Settlement]) -> set[int]:
        await conn.exec_driver_sql(sql.INDEX_PLANS_LOCAL)
        rows = await conn.exec_driver_sql(self._settle, _settle_args(settlements))
        return {r[0] for r in rows}

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        if not leases:
            return set()
        leases = sorted(leases)
        args = ([i for i, _ in leases], [d for _, d in leases], float(seconds))

        async def work(conn: AsyncConnection) -> set[int]:
            return {r[0] for r in await conn.exec_driver_sql(self._extend, args)}

        return await self._transaction(work)

    # ---- maintenance ---------------------------------------------------------------------

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        async def work(conn: AsyncConnection) -> list[int]:
            # One recoverer at a time: the others skip this round instead of racing it.
            got = await conn.exec_driver_sql(sql.RECOVERY_LOCK, (self.recovery_lock,))
            if not got.scalar():
                return []
            result = await conn.exec_driver_sql(self._recover, (limit, float(spread)))
            return [r[0] for r in result]

        return await self._transaction(work)

    def _migration_lock(self, conn: Connection) -> None:
        conn.exec_driver_sql(sql.MIGRATION_LOCK, (self.schema.prefix,))


def _as_sqlalchemy_error(exc: Exception, statement: str, dialect: Any) -> Exception:
    """asyncpg's error as SQLAlchemy would raise it for the same failure (IntegrityError,
    ProgrammingError, ...), so a caller catches one family whichever path a batch took. The
    translation table is the asyncpg dialect's own; without it, a plain DBAPIError."""
    dbapi = dialect.loaded_dbapi
    translate = getattr(dbapi, "_asyncpg_error_translate", None) or {}
    for cls in type(exc).__mro__:
        if cls in translate:
            orig = translate[cls](exc.args[0] if exc.args else str(exc), exc)
            return DBAPIError.instance(statement, None, orig, dbapi.Error, dialect=dialect)
    return DBAPIError.instance(statement, None, exc, Exception, dialect=dialect)


def _log_discarded(exc: BaseException) -> None:
    log.warning("a PostgreSQL connection was lost (%s); discarded it, and the statement, "
                "which had not reached the server, runs on another", describe(exc))


def _publish_unknown(messages: NewMessages, exc: BaseException) -> Exception:
    return PublishOutcomeUnknown(
        f"the connection to PostgreSQL was lost while publishing {len(messages)} message(s) "
        f"to {messages.queue!r}, after the publish was sent and before its commit was confirmed "
        f"({describe(exc)}): they may or may not have been written. sqlmq did not send them "
        "again, which could publish them twice; look for them before publishing again, or "
        "accept a duplicate"
    )


def _settle_args(settlements: Sequence[Settlement]) -> tuple[Any, ...]:
    """SETTLE's arguments: one array literal per column, the results a bytea array."""
    n = len(settlements)
    if all(s.outcome is Outcome.COMPLETE and s.error is None and s.history is None
           and s.attempted and s.keep for s in settlements):
        # The common flush, every handler returned: the constant columns are built once.
        outcomes, errors, delays = _same(Outcome.COMPLETE.value, n), _same("NULL", n), \
            _same("0", n)
        refunds, attempts, histories = _same("0", n), _same("1", n), errors
        keeps = attempts
    else:
        outcomes = _texts(s.outcome.value for s in settlements)
        errors = _texts(s.error for s in settlements)
        delays = _numbers(float(s.delay) for s in settlements)
        refunds = _numbers(1 if s.refund else 0 for s in settlements)
        attempts = _numbers(1 if s.attempted else 0 for s in settlements)
        histories = _texts(None if s.history is None else json.dumps(s.history)
                           for s in settlements)
        keeps = _numbers(1 if s.keep else 0 for s in settlements)
    results = (None if all(s.result is None for s in settlements)
               else [s.result for s in settlements])
    answers = (_numbers(1 if s.answers else 0 for s in settlements)
               if any(s.answers for s in settlements) else None)
    return (_numbers([s.id for s in settlements]), _numbers([s.deliveries for s in settlements]),
            outcomes, errors, delays, refunds, attempts, histories, keeps, results, answers)


def _numbers(values: Iterable[int | float]) -> str:
    return "{" + ",".join(map(repr, values)) + "}"


def _texts(values: Iterable[str | None]) -> str:
    return "{" + ",".join("NULL" if v is None else _quoted(v) for v in values) + "}"


def _same(value: str, n: int) -> str:
    """An array literal of ``n`` copies of one element."""
    return "{" + ",".join([value] * n) + "}"


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _from_epoch(seconds: float) -> datetime:
    # Exact to the microsecond: an epoch in float8 is off by under 0.2 µs, which rounds away.
    return datetime.fromtimestamp(seconds, UTC)


def _undecodable(r: Any, exc: BaseException) -> Delivery:
    return undecodable_delivery(r[0], r[1], r[4], r[5], exc)


def _decoded(rows: list[Any]) -> list[Delivery]:
    """The deliveries of acquired rows (ACQUIRE's columns first, in order). JSON comes as
    text and times as epoch seconds, each distinct value decoded once per batch: the
    driver would parse every message's headers and history, and build five datetimes per
    row at about 3 µs each, where a batch mostly repeats one header text, has no history
    and shares its acquisition, lease and often creation times."""
    headers, utc = BatchHeaders(), BatchTimes(_from_epoch)

    def decode(r: Any) -> Delivery:
        return Delivery(r[0], r[1], headers(r[2]), r[3], r[4], r[5], utc(r[6]), utc(r[7]),
                        utc(r[8]), utc(r[9]), utc(r[10]), decode_history(r[11]),
                        priority=r[12], expires_at=utc(r[13]), saved_state=r[14],
                        defers=r[15], cancel_requested=bool(r[16]))

    return decode_rows(rows, decode, _undecodable)


def _schedule_order(d: Delivery) -> tuple[int, Any, int]:
    """Acquire's order (UPDATE … RETURNING gives the rows in none): priority, ready, id."""
    return (-d.priority, d.scheduled_at, d.id)
