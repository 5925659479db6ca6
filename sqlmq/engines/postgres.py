"""PostgreSQL: acquire and settle are one statement each (CTEs, arrays via ``unnest``)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

try:
    import asyncpg
except ImportError:  # pragma: no cover - without sqlmq[postgresql]; parse_url says so
    asyncpg = None  # type: ignore[assignment]
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..backoff import describe
from ..errors import PublishOutcomeUnknown
from ..publishing import (
    PG_COPY_COLUMNS,
    PG_COPY_MIN,
    pg_copy_args,
    pg_copy_data,
    pg_copy_reserve,
    pg_insert,
)
from ..records import Delivery, NewMessage, Settlement
from ..schema import Schema
from ..states import Outcome
from .base import (
    ArchiveAndStatsMixin,
    BatchHeaders,
    BatchTimes,
    KeptConnections,
    SqlEngine,
    decode_history,
    decode_rows,
    discard,
    driver_connection,
    undecodable_delivery,
)
from .pg_errors import connection_lost, from_driver, never_sent

# The second condition on m.id is for the planner: without it, a ready CTE of a few hundred
# rows is hash-joined to a sequential scan of the whole backlog; with it, the rows are
# fetched by primary key.
_ACQUIRE = """
WITH ready AS (
    SELECT id, next_attempt_at FROM {m}
    WHERE {queue_predicate} AND next_attempt_at <= now()
    ORDER BY next_attempt_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE {m} AS m SET
    state = 'PROCESSING',
    deliveries_count = m.deliveries_count + 1,
    acquired_at = now(),
    first_attempt_at = COALESCE(m.first_attempt_at, now()),
    next_attempt_at = NULL,
    lease_expires_at = now() + CAST(:lease AS DOUBLE PRECISION) * INTERVAL '1 second'
FROM ready
WHERE m.id = ready.id AND m.id = ANY(ARRAY(SELECT id FROM ready))
RETURNING m.id, m.queue, CAST(m.headers AS TEXT), m.payload, m.attempts_count,
    m.deliveries_count, date_part('epoch', m.created_at), date_part('epoch', m.first_attempt_at),
    date_part('epoch', m.acquired_at), date_part('epoch', m.lease_expires_at),
    date_part('epoch', ready.next_attempt_at), CAST(m.history AS TEXT)
"""

# One round trip for a whole flush. Every branch is fenced on (id, deliveries, PROCESSING);
# the ids returned are the writes that landed, anything else was stale.
# ``locked`` takes the batch's row locks first, all of them (the count is a one-time filter
# of both writes) and in id order, as extend does: a flush and a lease renewal of the same
# rows locking them in different orders deadlocked (the draining process's flush order is
# the order handlers finish, the renewal's the order messages were acquired).
# The arrays travel as text literals ('{1,2,3}'): the server parses them in C, where the
# driver's array encoder would spend about a microsecond of Python per element.
_SETTLE = """
WITH i AS (
    SELECT * FROM unnest(
        CAST(CAST(:ids AS TEXT) AS BIGINT[]), CAST(CAST(:deliveries AS TEXT) AS INTEGER[]),
        CAST(CAST(:outcomes AS TEXT) AS TEXT[]), CAST(CAST(:errors AS TEXT) AS TEXT[]),
        CAST(CAST(:delays AS TEXT) AS DOUBLE PRECISION[]),
        CAST(CAST(:refunds AS TEXT) AS INTEGER[]), CAST(CAST(:attempts AS TEXT) AS INTEGER[]),
        CAST(CAST(:histories AS TEXT) AS TEXT[])
    ) AS i(id, deliveries, outcome, error, delay, refund, attempt, history)
),
locked AS MATERIALIZED (
    SELECT id FROM {m} WHERE id = ANY(CAST(CAST(:ids AS TEXT) AS BIGINT[]))
    ORDER BY id FOR UPDATE
),
done AS (
    DELETE FROM {m} AS m USING i
    WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
      AND i.outcome IN ('COMPLETED', 'FAILED') AND (SELECT count(*) FROM locked) >= 0
    RETURNING m.id, m.queue, m.headers, m.payload, m.attempts_count, m.deliveries_count,
        m.created_at, m.first_attempt_at, m.last_attempt_at, m.history AS old_history,
        i.outcome, i.error, i.attempt, i.history AS new_history
),
archived AS (
    INSERT INTO {a} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                     created_at, first_attempt_at, last_attempt_at, archived_at, error, history)
    SELECT id, queue, headers, payload, outcome, attempts_count + attempt, deliveries_count,
           created_at, first_attempt_at,
           CASE WHEN attempt = 1 THEN now() ELSE last_attempt_at END, now(), error,
           COALESCE(CAST(new_history AS JSONB), old_history)
    FROM done
    RETURNING id
),
moved AS (
    UPDATE {m} AS m SET
        state = CASE WHEN i.outcome = 'RETRY' THEN 'RETRYABLE' ELSE 'PENDING' END,
        attempts_count = m.attempts_count + i.attempt,
        -- a refunded first delivery (handed back unstarted) leaves no times behind
        first_attempt_at = CASE WHEN m.deliveries_count = i.refund THEN NULL
                                ELSE m.first_attempt_at END,
        acquired_at = CASE WHEN m.deliveries_count = i.refund THEN NULL ELSE m.acquired_at END,
        deliveries_count = m.deliveries_count - i.refund,
        last_attempt_at = CASE WHEN i.attempt = 1 THEN now() ELSE m.last_attempt_at END,
        next_attempt_at = now() + i.delay * INTERVAL '1 second',
        lease_expires_at = NULL,
        last_error = COALESCE(i.error, m.last_error),
        history = COALESCE(CAST(i.history AS JSONB), m.history)
    FROM i
    WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
      AND i.outcome IN ('RETRY', 'RELEASE') AND (SELECT count(*) FROM locked) >= 0
    RETURNING m.id
)
SELECT id FROM archived UNION ALL SELECT id FROM moved
"""

# Locks its rows in id order first, as settle does (see _SETTLE).
_EXTEND = """
WITH locked AS MATERIALIZED (
    SELECT id FROM {m} WHERE id = ANY(CAST(:ids AS BIGINT[])) ORDER BY id FOR NO KEY UPDATE
)
UPDATE {m} AS m
SET lease_expires_at = now() + CAST(:seconds AS DOUBLE PRECISION) * INTERVAL '1 second'
FROM unnest(CAST(:ids AS BIGINT[]), CAST(:deliveries AS INTEGER[])) AS i(id, deliveries)
WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
  AND (SELECT count(*) FROM locked) >= 0
RETURNING m.id
"""

# The history keeps its newest ten entries, like the runtime's own appends.
_RECOVER = """
UPDATE {m} AS m SET
    state = 'PENDING',
    next_attempt_at = now() + random() * CAST(:spread AS DOUBLE PRECISION) * INTERVAL '1 second',
    lease_expires_at = NULL,
    last_error = 'lease expired',
    history = (
        SELECT COALESCE(jsonb_agg(e ORDER BY o), '[]'::jsonb) FROM (
            SELECT e, o FROM jsonb_array_elements(
                COALESCE(m.history, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                    'delivery', m.deliveries_count, 'ended', 'lease_expired',
                    'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')
                ))
            ) WITH ORDINALITY AS x(e, o)
            ORDER BY o DESC LIMIT 10
        ) AS kept
    )
WHERE m.id IN (
    SELECT id FROM {m}
    WHERE lease_expires_at < now() AND state = 'PROCESSING'
    ORDER BY lease_expires_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
RETURNING m.id
"""

# The id column's sequence, from which a COPY reserves its ids (see PostgresEngine._copy).
_SEQUENCE = "SELECT pg_get_serial_sequence($1, 'id')"

# Held until the recovering transaction ends, so a crashed recoverer cannot keep it.
_RECOVERY_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext(:key))"

# Session settings of the connections acquire and settle run on, so that their plans do not
# depend on the table's statistics. A new table has none, or those of an empty table, and
# the planner then reads the whole table on every call: a sequential scan (and a sort), or a
# bitmap scan of every index entry of the queue, dead ones included. A prepared statement
# keeps such a generic plan until the first autovacuum ANALYZE, a minute or more into the
# load (measured: acquire from 0.2 to 400 ms at 67k dead tuples). Without these paths what
# is left reads the ready index in acquire order and the primary key by id (acquire's second
# condition on m.id bounds that side whatever the join order). Joins stay free: without hash
# joins, acquire's join took 30 ms instead of 1.4 for 500 rows. Left open: from an empty
# table's statistics, settle may still walk the whole primary key index as the outer side of
# its join (a bound like acquire's made the planner, misled by the state column's
# statistics, compare every batch row with every other: 160 ms for 500).
_INDEX_PLANS = ("enable_seqscan", "enable_bitmapscan")
_INDEX_PLANS_ON = "; ".join(f"SET {name} = off" for name in _INDEX_PLANS)
_INDEX_PLANS_OFF = "; ".join(f"RESET {name}" for name in _INDEX_PLANS)
_PLANNED = "sqlmq_index_plans"  # the key in a connection's info while they are set

#: Tries of a statement whose connection turns out dead before anything reached the server
#: (see never_sent): every kept connection dies at once when the server restarts or an
#: administrator ends sqlmq's sessions.
_SEND_TRIES = KeptConnections.KEEP_IDLE + 2

T = TypeVar("T")
log = logging.getLogger("sqlmq")


class PostgresEngine(KeptConnections, ArchiveAndStatsMixin, SqlEngine):
    dialect = "postgresql"

    def __init__(self, db: AsyncEngine, schema: Schema) -> None:
        super().__init__(db, schema)
        # acquire, settle and publish are the hot path: they go straight to asyncpg (statements
        # prepared once per connection, rows read without SQLAlchemy's per-row processing).
        self._acquire_one = self._numbered(acquire_text("queue = :queue"),
                                           ("queue", "limit", "lease"))
        self._acquire_many = self._numbered(
            acquire_text("queue = ANY(CAST(:queues AS TEXT[]))"), ("queues", "limit", "lease")
        )
        self._settle = self._numbered(_SETTLE, SETTLE_PARAMS)
        self._reserve: str | None = None  # the statement that precedes a COPY
        self._can_copy = True  # False once the id column turns out to have no sequence
        self._inserts: dict[str, str] = {}  # pg_insert's text -> its numbered form

    def _numbered(self, statement: str, params: Sequence[str]) -> str:
        return numbered(statement.format(**self.names), params)

    async def acquire(self, queues: Sequence[str], limit: int, lease: float) -> list[Delivery]:
        if len(queues) == 1:
            rows = await self._fetch(self._acquire_one, queues[0], limit, float(lease),
                                     index_plans=True)
        else:
            rows = await self._fetch(self._acquire_many, list(queues), limit, float(lease),
                                     index_plans=True)
        # JSON comes as text and times as epoch seconds, each distinct value decoded once
        # per batch: the driver would parse every message's headers and history, and build
        # five datetimes per row at about 3 µs each, where a batch mostly repeats one header
        # text, has no history and shares its acquisition, lease and often creation times.
        headers, utc = BatchHeaders(), BatchTimes(_from_epoch)

        def decode(r: Any) -> Delivery:
            return Delivery(r[0], r[1], headers(r[2]), r[3], r[4], r[5], utc(r[6]), utc(r[7]),
                            utc(r[8]), utc(r[9]), utc(r[10]), decode_history(r[11]))

        out = decode_rows(rows, decode, _undecodable)
        out.sort(key=_schedule_order)
        return out

    async def settle(self, settlements: Sequence[Settlement]) -> set[int]:
        if not settlements:
            return set()
        n = len(settlements)
        if all(s.outcome is Outcome.COMPLETE and s.error is None and s.history is None
               and s.attempted for s in settlements):
            # The common flush, every handler returned: the constant columns are built once.
            outcomes, errors, delays = _same("COMPLETED", n), _same("NULL", n), _same("0", n)
            refunds, attempts, histories = _same("0", n), _same("1", n), errors
        else:
            outcomes = _texts(s.outcome.value for s in settlements)
            errors = _texts(s.error for s in settlements)
            delays = _numbers(float(s.delay) for s in settlements)
            refunds = _numbers(1 if s.refund else 0 for s in settlements)
            attempts = _numbers(1 if s.attempted else 0 for s in settlements)
            histories = _texts(None if s.history is None else json.dumps(s.history)
                               for s in settlements)
        rows = await self._fetch(
            self._settle,
            _numbers([s.id for s in settlements]),
            _numbers([s.deliveries for s in settlements]),
            outcomes, errors, delays, refunds, attempts, histories,
            index_plans=True,
        )
        return {r[0] for r in rows}

    async def insert(self, messages: list[NewMessage]) -> list[int]:
        """Publish a batch on sqlmq's own connection. A small one is one statement, one round
        trip, straight on asyncpg like acquire and settle (through SQLAlchemy a single
        publish cost 2.5 times the client CPU, which a busy publisher shares with its
        subscribers); from ``PG_COPY_MIN`` messages on, by binary COPY, which costs both
        sides less per row (see :mod:`sqlmq.publishing`).

        A connection lost before the publish reached the server, or before its COMMIT was
        sent, wrote nothing: the publish runs again on another connection. Lost after that,
        the outcome is unknown, and :class:`PublishOutcomeUnknown` says so."""
        if len(messages) >= PG_COPY_MIN and self._can_copy:
            ids = await self._copy(messages)
            if ids is not None:
                return ids
        sql, params = pg_insert(self.schema, messages)
        statement = self._inserts.get(sql)
        if statement is None:  # two texts in all: with ``at`` or with ``delay``
            statement = self._inserts[sql] = numbered(sql, tuple(params))
        rows = await self._fetch(statement, *params.values(),
                                 unknown=lambda exc: _publish_unknown(messages, exc))
        return list(rows[0][0])

    async def _copy(self, messages: list[NewMessage]) -> list[int] | None:
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
                ids = await self._copy_on(await driver_connection(conn), messages, stage)
            except Exception as exc:
                if conn is not None:
                    await discard(conn)
                lost = never_sent(exc) or connection_lost(exc)
                if lost and stage[0] == "COMMIT" and not never_sent(exc):
                    raise _publish_unknown(messages, exc) from exc
                if lost and (conn is not None or never_sent(exc)) and attempt < _SEND_TRIES:
                    _log_discarded(exc)
                    continue
                raise self._translated(exc, stage[0]) from exc
            except BaseException:
                if conn is not None:
                    await discard(conn)
                raise
            if ids is None:
                self._can_copy = False
            await self._checkin(conn)
            return ids
        raise AssertionError("unreachable")  # pragma: no cover

    async def _copy_on(self, raw: Any, messages: list[NewMessage],
                       stage: list[str]) -> list[int] | None:
        """The COPY transaction on one driver connection; ``stage[0]`` names the statement
        in progress (``COMMIT`` last)."""
        stage[0] = _SEQUENCE
        if self._reserve is None:
            sequence = await raw.fetchval(_SEQUENCE, self.schema.message.name)
            if sequence is None:
                return None
            self._reserve = pg_copy_reserve(sequence)
        transaction = raw.transaction()
        stage[0] = "BEGIN"
        await transaction.start()
        stage[0] = self._reserve
        row = await raw.fetchrow(self._reserve, *pg_copy_args(self.schema, messages))
        created_at, next_attempt_at, ids = row[0], row[1], sorted(row[2])
        stage[0] = f"COPY {self.schema.message.name} FROM STDIN (FORMAT binary)"
        await raw.copy_to_table(
            self.schema.message.name, columns=PG_COPY_COLUMNS, format="binary",
            source=pg_copy_data(messages, ids, created_at, next_attempt_at),
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
                    await raw.execute(_INDEX_PLANS_ON)
                    conn.info[_PLANNED] = True
                sent = True
                rows = await raw.fetch(statement, *args)
            except Exception as exc:
                if conn is not None:
                    await discard(conn)
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
                    await discard(conn)
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
                await (await driver_connection(conn)).execute(_INDEX_PLANS_OFF)
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

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        if not leases:
            return set()
        leases = sorted(leases)
        params = {"ids": [i for i, _ in leases], "deliveries": [d for _, d in leases],
                  "seconds": seconds}

        async def work(conn: AsyncConnection) -> set[int]:
            return {r[0] for r in await conn.execute(self.sql(_EXTEND), params)}

        return await self._transaction(work)

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        async def work(conn: AsyncConnection) -> list[int]:
            # One recoverer at a time: the others skip this round instead of racing it.
            got = await conn.execute(self.sql(_RECOVERY_LOCK), {"key": self.recovery_lock})
            if not got.scalar():
                return []
            result = await conn.execute(self.sql(_RECOVER), {"limit": limit, "spread": spread})
            return [r[0] for r in result]

        return await self._transaction(work)


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


def _publish_unknown(messages: Sequence[NewMessage], exc: BaseException) -> Exception:
    queues = ", ".join(sorted({repr(m.queue) for m in messages}))
    return PublishOutcomeUnknown(
        f"the connection to PostgreSQL was lost while publishing {len(messages)} message(s) "
        f"to {queues}, after the publish was sent and before its commit was confirmed "
        f"({describe(exc)}): they may or may not have been written. sqlmq did not send them "
        "again, which could publish them twice; look for them before publishing again, or "
        "accept a duplicate"
    )


SETTLE_PARAMS = ("ids", "deliveries", "outcomes", "errors", "delays", "refunds", "attempts",
                 "histories")


def acquire_text(queue_predicate: str) -> str:
    """The acquire statement (with ``:named`` parameters) for one queue predicate."""
    return _ACQUIRE.replace("{queue_predicate}", queue_predicate)


def numbered(statement: str, params: Sequence[str]) -> str:
    """``:name`` parameters to asyncpg's ``$n``, numbered in the order of ``params``."""
    index = {name: i for i, name in enumerate(params, 1)}
    return re.sub(r"(?<![:\w]):([a-z_]+)\b", lambda m: f"${index[m.group(1)]}", statement)


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


def _schedule_order(d: Delivery) -> tuple[Any, int]:
    return (d.scheduled_at, d.id)
