"""SQLite: every transaction is ``BEGIN IMMEDIATE`` (set up in :mod:`sqlmq.connect`), so a
writer holds the database's single write lock from its first statement. That serialises
acquire and settle across processes sharing one file, which is what SKIP LOCKED gives the
server databases; WAL keeps readers going meanwhile.

Since one transaction at a time writes, the time a transaction takes is the throughput: the
hot path (acquire, settle) runs its statements straight on aiosqlite, one trip to the
driver's thread each, and turns plain tuples into records after the commit.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from ..connect import write_turn
from ..records import Delivery, NewMessage, Settlement
from ..sqltime import SQLITE_NOW, sqlite_now_plus
from .base import (
    ArchiveAndStatsMixin,
    BatchHeaders,
    BatchTimes,
    KeptConnections,
    SqlEngine,
    blob,
    decode_history,
    decode_rows,
    discard,
    driver_connection,
    leased_delivery,
    ready_order,
    undecodable_delivery,
)

NOW = SQLITE_NOW

_READY = f"""
SELECT id, next_attempt_at AS scheduled_at FROM {{m}}
WHERE queue IN (SELECT value FROM json_each(:queues)) AND next_attempt_at <= {NOW}
ORDER BY next_attempt_at, id
LIMIT :limit
"""

_TAKE = f"""
UPDATE {{m}} SET
    state = 'PROCESSING',
    deliveries_count = deliveries_count + 1,
    acquired_at = {NOW},
    first_attempt_at = COALESCE(first_attempt_at, {NOW}),
    next_attempt_at = NULL,
    lease_expires_at = {sqlite_now_plus(':lease')}
WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING id, queue, headers, payload, attempts_count, deliveries_count, created_at,
    first_attempt_at, acquired_at, lease_expires_at, NULL AS scheduled_at, history
"""

_ONE_QUEUE = "queue = :queue"
_QUEUE_LIST = "queue IN (SELECT value FROM json_each(:queues))"


def lease_statements(names: dict[str, str]) -> tuple[str, str]:
    """The acquire, for a caller that must acquire inside its own transaction and record
    what it took in that same transaction (the Spark stream's leases: a crash must not
    leave messages acquired and recorded nowhere): the ids of up to ``:limit`` ready rows
    of queue ``:queue``, then the statement that marks ids ``:ids`` (a JSON array)
    PROCESSING for ``:lease`` seconds and returns the acquire's columns."""
    return _READY.replace(_QUEUE_LIST, _ONE_QUEUE).format(**names), _TAKE.format(**names)


def archive_statements(names: dict[str, str]) -> tuple[str, str]:
    """The settle of archiving outcomes (COMPLETED, FAILED), for a caller that must settle
    inside its own transaction (the Spark stream, which drops its lease rows and records
    the acknowledged sequence in the same one): archive the batch ``:input`` (see
    ``SqlEngine.settlement_json``), then delete it, returning the ids that landed."""
    return _ARCHIVE.format(**names), _DELETE.format(**names)

# The input batch, one JSON array per settlement (see SqlEngine.settlement_json).
_INPUT = """
WITH i AS (
    SELECT value->>0 AS id, value->>1 AS deliveries, value->>2 AS outcome, value->>3 AS error,
           value->>4 AS delay, value->>5 AS refund, value->>6 AS attempt, value->>7 AS history
    FROM json_each(:input)
)
"""

_ARCHIVE = _INPUT + f"""
INSERT INTO {{a}} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                   created_at, first_attempt_at, last_attempt_at, archived_at, error, history)
SELECT m.id, m.queue, m.headers, m.payload, i.outcome, m.attempts_count + i.attempt,
       m.deliveries_count, m.created_at, m.first_attempt_at,
       CASE WHEN i.attempt = 1 THEN {NOW} ELSE m.last_attempt_at END, {NOW}, i.error,
       COALESCE(i.history, m.history)
FROM i JOIN {{m}} AS m ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED')
"""

# BEGIN IMMEDIATE holds every other writer off, so this deletes exactly the rows just archived.
_DELETE = _INPUT + """
DELETE FROM {m} WHERE id IN (
    SELECT m.id FROM i JOIN {m} AS m ON m.id = i.id AND m.deliveries_count = i.deliveries
    WHERE m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED')
)
RETURNING id
"""

_UPDATE = _INPUT + f"""
UPDATE {{m}} AS m SET
    state = CASE WHEN i.outcome = 'RETRY' THEN 'RETRYABLE' ELSE 'PENDING' END,
    attempts_count = m.attempts_count + i.attempt,
    first_attempt_at = CASE WHEN m.deliveries_count = i.refund THEN NULL
                            ELSE m.first_attempt_at END,
    acquired_at = CASE WHEN m.deliveries_count = i.refund THEN NULL ELSE m.acquired_at END,
    deliveries_count = m.deliveries_count - i.refund,
    last_attempt_at = CASE WHEN i.attempt = 1 THEN {NOW} ELSE m.last_attempt_at END,
    next_attempt_at = {sqlite_now_plus('i.delay')},
    lease_expires_at = NULL,
    last_error = COALESCE(i.error, m.last_error),
    history = COALESCE(i.history, m.history)
FROM i
WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
  AND i.outcome IN ('RETRY', 'RELEASE')
RETURNING id
"""

# RETURNING may name only the updated table's columns, and not through its alias.
# One message published on sqlmq's own engine: the commonest publish, and in one process the
# first half of publish-to-handler latency. Same row as the general INSERT in publishing.py.
_INSERT_ONE = f"""
INSERT INTO {{m}} (queue, headers, payload, state, attempts_count, deliveries_count,
                   created_at, next_attempt_at)
VALUES (:queue, :headers, :payload, 'PENDING', 0, 0, {NOW}, {sqlite_now_plus(':delay')})
RETURNING id
"""

# A single publish handed straight to an idle subscriber of this process: the row is written
# as an acquire would leave it (see Broker.publish_batch).
_INSERT_LEASED = f"""
INSERT INTO {{m}} (queue, headers, payload, state, attempts_count, deliveries_count,
                   created_at, first_attempt_at, acquired_at, next_attempt_at, lease_expires_at)
VALUES (:queue, :headers, :payload, 'PROCESSING', 0, 1, {NOW}, {NOW}, {NOW}, NULL,
        {sqlite_now_plus(':lease')})
RETURNING id, created_at, lease_expires_at
"""

_EXTEND = f"""
UPDATE {{m}} AS m SET lease_expires_at = {sqlite_now_plus(':seconds')}
FROM (SELECT value->>0 AS id, value->>1 AS deliveries FROM json_each(:leases)) AS i
WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
RETURNING id
"""

_APPENDED = """json_insert(COALESCE(history, '[]'), '$[#]', json_object(
    'delivery', deliveries_count, 'ended', 'lease_expired',
    'at', strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')))"""

_RECOVER = f"""
UPDATE {{m}} SET
    state = 'PENDING',
    next_attempt_at = {sqlite_now_plus('(abs(random()) % 1000000) / 1000000.0 * :spread')},
    lease_expires_at = NULL,
    last_error = 'lease expired',
    history = CASE WHEN json_array_length({_APPENDED}) > 10
                   THEN json_remove({_APPENDED}, '$[0]') ELSE {_APPENDED} END
WHERE id IN (
    SELECT id FROM {{m}}
    WHERE lease_expires_at < {NOW} AND state = 'PROCESSING'
    ORDER BY lease_expires_at
    LIMIT :limit
)
RETURNING id
"""


class SqliteEngine(KeptConnections, ArchiveAndStatsMixin, SqlEngine):
    dialect = "sqlite"
    AUTOCOMMIT = False  # the driver's connections already are: no BEGIN unless sent

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = self.names
        one_queue = _READY.replace(_QUEUE_LIST, _ONE_QUEUE)
        self._ready_sql = (_READY.format(**names), one_queue.format(**names))
        self._take_sql = _TAKE.format(**names)
        self._archive_sql = _ARCHIVE.format(**names)
        self._delete_sql = _DELETE.format(**names)
        self._update_sql = _UPDATE.format(**names)
        self._insert_one_sql = _INSERT_ONE.format(**names)
        self._insert_leased_sql = _INSERT_LEASED.format(**names)
        self._commits: CommitWatch | None = None

    def commit_counter(self) -> Callable[[], int | None] | None:
        """SQLite's ``data_version`` of the database file (see :class:`CommitWatch`); None
        for an in-memory or URI-named database, which other processes cannot share."""
        path = self.db.url.database
        if not path or path == ":memory:" or path.startswith("file:"):
            return None
        if self._commits is None:
            self._commits = CommitWatch(path)
        return self._commits.version

    async def close(self) -> None:
        await super().close()
        if self._commits is not None:
            self._commits.close()
            self._commits = None

    async def insert_one(self, message: NewMessage) -> int:
        """Publish one message (``at`` unset) in its own transaction, straight on aiosqlite."""
        params = {"queue": message.queue, "headers": json.dumps(message.headers),
                  "payload": message.payload, "delay": message.delay}
        ((msg_id,),) = await self._alone(self._insert_one_sql, params)
        return int(msg_id)

    async def _alone(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        """One statement that commits by itself, on a kept connection, in this process's
        write turn: one trip to the driver's thread, where BEGIN IMMEDIATE, the statement
        and COMMIT take three (and a pool checkout a rollback more)."""
        conn = await self._checkout()
        try:
            async with write_turn(self.db):
                rows = await _fetch(conn, sql, params)
        except BaseException:
            await discard(conn)
            raise
        await self._checkin(conn)
        return rows

    async def insert_leased(self, message: NewMessage, lease: float) -> Delivery:
        """Publish one message already acquired, for a subscriber of this process."""
        params = {"queue": message.queue, "headers": json.dumps(message.headers),
                  "payload": message.payload, "lease": lease}
        ((msg_id, created_at, lease_expires_at),) = await self._alone(
            self._insert_leased_sql, params)
        return leased_delivery(message, int(msg_id), _stored_time(created_at),
                               _stored_time(lease_expires_at))

    async def acquire(self, queues: Sequence[str], limit: int, lease: float) -> list[Delivery]:
        # One queue reads the ready index in order; a list of queues (json_each) makes
        # SQLite sort every ready row of the backlog on each acquire.
        if len(queues) == 1:
            ready_sql, params = self._ready_sql[1], {"queue": queues[0], "limit": limit}
        else:
            ready_sql, params = self._ready_sql[0], {"queues": json.dumps(list(queues)),
                                                     "limit": limit}
        async with self.db.begin() as conn:
            ready = await _fetch(conn, ready_sql, params)
            if not ready:
                return []
            rows = await _fetch(conn, self._take_sql,
                                {"ids": json.dumps([r[0] for r in ready]), "lease": lease})
        scheduled = dict(ready)
        headers, utc = BatchHeaders(), BatchTimes(_stored_time)

        def decode(r: Any) -> Delivery:
            return Delivery(
                id=r[0],
                queue=r[1],
                headers=headers(r[2]),
                payload=blob(r[3]),
                attempts=r[4],
                deliveries=r[5],
                created_at=utc(r[6]),
                first_attempt_at=utc(r[7]),
                acquired_at=utc(r[8]),
                lease_expires_at=utc(r[9]),
                scheduled_at=utc(scheduled[r[0]]),
                history=decode_history(r[11]),
            )

        out = decode_rows(rows, decode, _undecodable)
        out.sort(key=ready_order)
        return out

    async def settle(self, settlements: Sequence[Settlement]) -> set[int]:
        if not settlements:
            return set()
        params = {"input": self.settlement_json(settlements)}
        outcomes = {s.outcome.value for s in settlements}
        applied: set[int] = set()
        async with self.db.begin() as conn:
            if outcomes & {"COMPLETED", "FAILED"}:
                await _fetch(conn, self._archive_sql, params)
                applied.update(r[0] for r in await _fetch(conn, self._delete_sql, params))
            if outcomes & {"RETRY", "RELEASE"}:
                applied.update(r[0] for r in await _fetch(conn, self._update_sql, params))
        return applied

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        if not leases:
            return set()
        async with self.db.begin() as conn:
            result = await conn.execute(
                self.sql(_EXTEND),
                {"leases": json.dumps([list(x) for x in leases]), "seconds": seconds},
            )
            return {r[0] for r in result}

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        # BEGIN IMMEDIATE already makes recoverers take turns; no lock of our own needed.
        async with self.db.begin() as conn:
            result = await conn.execute(self.sql(_RECOVER), {"limit": limit, "spread": spread})
            return [r[0] for r in result]


class CommitWatch:
    """Whether anyone has committed to the database file since the last look.

    ``PRAGMA data_version`` changes whenever another connection, in this process or any
    other, commits a write. Reading it takes about 4 µs on a connection of its own, with no
    transaction and no write lock, so an idle subscriber can look every few milliseconds
    for another process's publish, where an acquire that often (a write transaction) would
    contend with every writer. Delayed messages that fall due commit nothing: polling still
    finds those. Any error reads as a change, and the acquire that follows sorts it out.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None

    def version(self) -> int | None:
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(self._path, timeout=0, isolation_level=None,
                                             check_same_thread=False)
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            self.close()
            return None

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None


async def _fetch(conn: AsyncConnection, sql: str, params: Mapping[str, Any]) -> list[Any]:
    """One statement straight on aiosqlite, in ``conn``'s transaction: a single trip to the
    driver's thread and plain tuples back, where SQLAlchemy's cursor takes three trips and
    processes every value. Errors come out wrapped as SQLAlchemy's, like the others."""
    try:
        raw = await driver_connection(conn)
        return list(await raw.execute_fetchall(sql, params))
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, None, exc, sqlite3.Error,
                                  dialect=conn.engine.dialect) from exc


def _undecodable(r: Any, exc: BaseException) -> Delivery:
    return undecodable_delivery(r[0], r[1], r[4], r[5], exc)


def _stored_time(value: str | datetime) -> datetime:
    """Stored ISO text (naive UTC) as an aware datetime."""
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    return parsed.replace(tzinfo=UTC)
