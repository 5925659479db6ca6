"""MySQL 8 and MariaDB 10.6+: no ``UPDATE … RETURNING``, so acquire is a short transaction
(``SELECT … FOR UPDATE SKIP LOCKED``, then one ``UPDATE``). A settle batch travels as one
JSON value, opened with ``JSON_TABLE``; its rows are locked first so that copying to the
archive and deleting see the same rows. Sessions run READ COMMITTED (set in
:mod:`sqlmq.connect`) to keep gap locks out of the way of other consumers.

The hot path (acquire, settle) sends each transaction's statements in one packet, straight
on the driver (asyncmy always allows multi-statements), and reads plain tuples: a round
trip per statement and SQLAlchemy's per-row result processing were most of a drain's time.
The locked ids stay on the server in a session variable between the statements, so nothing
has to come back to the client in between.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from ..records import Delivery, NewMessage, Settlement
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
    leased_delivery,
    ready_order,
    undecodable_delivery,
)

NOW = "UTC_TIMESTAMP(6)"

# The hot path's connections are in autocommit (see KeptConnections): a packet that needs a
# transaction opens and commits it itself, so that the COMMIT travels with the statements.
_BEGIN: tuple[str, Sequence[Any]] = ("START TRANSACTION", ())
_COMMIT: tuple[str, Sequence[Any]] = ("COMMIT", ())

# A single publish: the INSERT commits itself, and the id comes back in the same packet.
_INSERT_ONE = f"""
INSERT INTO {{m}} (queue, headers, payload, state, attempts_count, deliveries_count,
                   created_at, next_attempt_at)
VALUES (%s, %s, %s, 'PENDING', 0, 0, {NOW}, {NOW} + INTERVAL %s MICROSECOND)
"""
_LAST_ID: tuple[str, Sequence[Any]] = ("SELECT LAST_INSERT_ID()", ())

# A single publish handed straight to an idle subscriber of this process: the row is written
# as an acquire would leave it (see Broker.publish_batch), at one clock reading.
_INSERT_LEASED = (
    f"SET @sqlmq_now = {NOW}",
    """INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                   created_at, first_attempt_at, acquired_at, next_attempt_at, lease_expires_at)
VALUES (%s, %s, %s, 'PROCESSING', 0, 1, @sqlmq_now, @sqlmq_now, @sqlmq_now, NULL,
        @sqlmq_now + INTERVAL %s MICROSECOND)""",
    "SELECT LAST_INSERT_ID(), CAST(@sqlmq_now AS DATETIME(6))",
)

# ---- acquire: one packet, one transaction ---------------------------------------------------
#
# 1. lock up to :limit ready rows, reading the ready index only, and keep their ids (and the
#    clock) in session variables;
# 2. return those rows as they are now;
# 3. mark them PROCESSING.
# The driver formats the parameters (%s); the queue list becomes one %s per queue.

_TAKEN = "JSON_TABLE(@sqlmq_take, '$[*]' COLUMNS (id BIGINT PATH '$')) AS t"

_LOCK_READY = f"""
SELECT JSON_ARRAYAGG(id), {NOW} INTO @sqlmq_take, @sqlmq_now FROM (
    SELECT id FROM {{m}}
    WHERE queue IN ({{queues}}) AND next_attempt_at <= {NOW}
    ORDER BY next_attempt_at, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
) AS r
"""

_READ_TAKEN = f"""
SELECT m.id, m.queue, m.headers, m.payload, m.attempts_count, m.deliveries_count,
       m.created_at, m.first_attempt_at, m.next_attempt_at, m.history,
       CAST(@sqlmq_now AS DATETIME(6))
FROM {_TAKEN} STRAIGHT_JOIN {{m}} AS m FORCE INDEX (PRIMARY) ON m.id = t.id
"""

_TAKE = f"""
UPDATE {_TAKEN} STRAIGHT_JOIN {{m}} AS m FORCE INDEX (PRIMARY) ON m.id = t.id SET
    m.state = 'PROCESSING',
    m.deliveries_count = m.deliveries_count + 1,
    m.acquired_at = CAST(@sqlmq_now AS DATETIME(6)),
    m.first_attempt_at = COALESCE(m.first_attempt_at, CAST(@sqlmq_now AS DATETIME(6))),
    m.next_attempt_at = NULL,
    m.lease_expires_at = CAST(@sqlmq_now AS DATETIME(6)) + INTERVAL %s MICROSECOND
"""

#: JSON_ARRAYAGG is cut at ``group_concat_max_len`` bytes on MariaDB (and its results were
#: cut at 64 KiB by MDEV-37835); an id takes at most 21 (19 digits, a comma and a space), so
#: an acquire takes at most as many rows as fit below both.
_ID_LIST = 65_535
_ID_BYTES = 21


def lease_statements(names: dict[str, str]) -> tuple[str, str, str]:
    """The acquire, for a caller that must acquire inside its own transaction and record
    what it took in that same transaction (the Spark stream's leases: a crash must not
    leave messages acquired and recorded nowhere). Statement one locks up to ``%s`` ready
    rows of the queues ``%s`` into ``@sqlmq_take`` (parameters: the queue, then the limit),
    statement two marks them PROCESSING for ``%s`` microseconds; the third item is a
    ``FROM`` clause joining the taken ids to the message table, aliased ``m``."""
    return (_LOCK_READY.format(**names, queues="%s"), _TAKE.format(**names),
            f"{_TAKEN} STRAIGHT_JOIN {names['m']} AS m FORCE INDEX (PRIMARY) ON m.id = t.id")


def take_limit(group_concat_max_len: int | None) -> int:
    """The most ids one acquire may take (see ``_ID_LIST``), given MariaDB's
    ``group_concat_max_len`` (``None`` on MySQL)."""
    limit = _ID_LIST if group_concat_max_len is None else min(_ID_LIST, group_concat_max_len)
    return max(1, limit // _ID_BYTES)


def archive_statements(names: dict[str, str]) -> tuple[str, ...]:
    """The settle of archiving outcomes (COMPLETED, FAILED), for a caller that must settle
    inside its own transaction (the Spark stream, which drops its lease rows and records
    the acknowledged sequence in the same one): set the batch (one ``%s``, see
    ``SqlEngine.settlement_json``), lock its rows (the ids that will land), archive, delete,
    clear the batch."""
    return tuple(q.format(**names) for q in (_SET_INPUT, _LOCK, _ARCHIVE, _DELETE,
                                              _CLEAR_INPUT))


# ---- settle: one packet, one transaction ----------------------------------------------------
#
# The batch is one JSON value (see SqlEngine.settlement_json), put in a session variable once
# and opened by each statement. Its rows are locked first, so that archiving, deleting and
# updating see the same rows; the ids locked are what the caller gets back.

_SET_INPUT = "SET @sqlmq_settle = %s"
_CLEAR_INPUT = "SET @sqlmq_settle = NULL"

_INPUT = """JSON_TABLE(@sqlmq_settle, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]', outcome VARCHAR(10) PATH '$[2]',
    error LONGTEXT PATH '$[3]', delay DOUBLE PATH '$[4]', refund INT PATH '$[5]',
    attempt INT PATH '$[6]', history LONGTEXT PATH '$[7]'
)) AS i"""

# The batch drives every join, by primary key (STRAIGHT_JOIN, FORCE INDEX): on a small table
# the optimizer would rather scan it, locking rows that are not in the batch and deadlocking
# with acquire.
_JOIN = (_INPUT + " STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY)"
         " ON m.id = i.id AND m.deliveries_count = i.deliveries")

_LOCK = f"SELECT m.id FROM {_JOIN} WHERE m.state = 'PROCESSING' FOR UPDATE"

_ENDED = "m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED')"

_ARCHIVE = f"""
INSERT INTO {{a}} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                   created_at, first_attempt_at, last_attempt_at, archived_at, error, history)
SELECT m.id, m.queue, m.headers, m.payload, i.outcome, m.attempts_count + i.attempt,
       m.deliveries_count, m.created_at, m.first_attempt_at,
       CASE WHEN i.attempt = 1 THEN {NOW} ELSE m.last_attempt_at END, {NOW}, i.error,
       COALESCE(i.history, m.history)
FROM {_JOIN}
WHERE {_ENDED}
"""

_DELETE = f"DELETE m FROM {_JOIN} WHERE {_ENDED}"

_UPDATE = f"""
UPDATE {_JOIN} SET
    m.state = CASE WHEN i.outcome = 'RETRY' THEN 'RETRYABLE' ELSE 'PENDING' END,
    m.attempts_count = m.attempts_count + i.attempt,
    m.first_attempt_at = CASE WHEN m.deliveries_count = i.refund THEN NULL
                              ELSE m.first_attempt_at END,
    m.acquired_at = CASE WHEN m.deliveries_count = i.refund THEN NULL ELSE m.acquired_at END,
    m.deliveries_count = m.deliveries_count - i.refund,
    m.last_attempt_at = CASE WHEN i.attempt = 1 THEN {NOW} ELSE m.last_attempt_at END,
    m.next_attempt_at = {NOW} + INTERVAL CAST(i.delay * 1000000 AS SIGNED) MICROSECOND,
    m.lease_expires_at = NULL,
    m.last_error = COALESCE(i.error, m.last_error),
    m.history = COALESCE(i.history, m.history)
WHERE m.state = 'PROCESSING' AND i.outcome IN ('RETRY', 'RELEASE')
"""

_EXTEND_LOCK = """
SELECT m.id FROM JSON_TABLE(:leases, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]')) AS i
  STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY) ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING' FOR UPDATE
"""

_EXTEND = f"""
UPDATE {{m}} SET lease_expires_at = {NOW} + INTERVAL :us MICROSECOND WHERE id IN :ids
"""

_EXPIRED = f"""
SELECT id FROM {{m}} WHERE lease_expires_at < {NOW} AND state = 'PROCESSING'
ORDER BY lease_expires_at LIMIT :limit FOR UPDATE SKIP LOCKED
"""

_APPENDED = f"""JSON_ARRAY_APPEND(COALESCE(history, '[]'), '$', JSON_OBJECT(
    'delivery', deliveries_count, 'ended', 'lease_expired',
    'at', DATE_FORMAT({NOW}, '%Y-%m-%dT%H:%i:%s.%f+00:00')))"""

_RECOVER = f"""
UPDATE {{m}} SET
    state = 'PENDING',
    next_attempt_at = {NOW} + INTERVAL CAST(RAND() * :spread * 1000000 AS SIGNED) MICROSECOND,
    lease_expires_at = NULL,
    last_error = 'lease expired',
    history = CASE WHEN JSON_LENGTH({_APPENDED}) > 10
                   THEN JSON_REMOVE({_APPENDED}, '$[0]') ELSE {_APPENDED} END
WHERE id IN :ids
"""


class MysqlEngine(KeptConnections, ArchiveAndStatsMixin, SqlEngine):
    dialect = "mysql"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        ids = bindparam("ids", expanding=True)
        self._extend = self.sql(_EXTEND).bindparams(ids)
        self._recover = self.sql(_RECOVER).bindparams(ids)
        names = self.names
        self._take_packet = [
            s.format(**names, queues="{queues}") for s in (_LOCK_READY, _READ_TAKEN, _TAKE)
        ]
        self._settle_sql = {
            name: statement.format(**names)
            for name, statement in (
                ("set", _SET_INPUT), ("lock", _LOCK), ("archive", _ARCHIVE),
                ("delete", _DELETE), ("update", _UPDATE), ("clear", _CLEAR_INPUT),
            )
        }
        self._insert_one_sql = _INSERT_ONE.format(**names)
        self._insert_leased_sql = tuple(q.format(**names) for q in _INSERT_LEASED)
        self._max_batch: int | None = None
        # asyncmy always allows several statements per packet; another driver (aiomysql, on
        # an engine the caller built) gets them one at a time, in the same transaction.
        self._multi = self.db.dialect.driver == "asyncmy"

    async def _id_list_limit(self, conn: AsyncConnection) -> int:
        """The most ids one acquire may gather in its session variable (see _ID_LIST)."""
        limit = _ID_LIST
        if getattr(self.db.dialect, "is_mariadb", False):
            (rows,) = await _run(conn, [("SELECT @@group_concat_max_len", [])], False)
            limit = min(limit, int(rows[0][0]))
        return max(1, limit // _ID_BYTES)

    async def insert_one(self, message: NewMessage) -> int:
        """Publish one message (``at`` unset) on a kept connection: one round trip, the
        INSERT committing itself, where the general path's pool checkout, INSERT and COMMIT
        take three."""
        delay = round(message.delay * 1_000_000)
        args = [message.queue, json.dumps(message.headers), message.payload, delay]
        ((row,),) = await self._packet([(self._insert_one_sql, args), _LAST_ID], keep=[1])
        return int(row[0])

    async def insert_leased(self, message: NewMessage, lease: float) -> Delivery:
        """Publish one message already acquired, for a subscriber of this process."""
        us = round(lease * 1_000_000)
        clock, insert, read = self._insert_leased_sql
        ((row,),) = await self._packet([
            (clock, ()),
            (insert, [message.queue, json.dumps(message.headers), message.payload, us]),
            (read, ()),
        ], keep=[2])
        now = _utc(row[1])
        return leased_delivery(message, int(row[0]), now, now + timedelta(microseconds=us))

    async def acquire(self, queues: Sequence[str], limit: int, lease: float) -> list[Delivery]:
        if self._max_batch is None:
            conn = await self._checkout()
            try:
                self._max_batch = await self._id_list_limit(conn)
            except BaseException:
                await discard(conn)
                raise
            await self._checkin(conn)
        lock, read, take = self._take_packet
        marks = ", ".join(["%s"] * len(queues))
        (rows,) = await self._packet([
            _BEGIN,
            (lock.replace("{queues}", marks), [*queues, min(limit, self._max_batch)]),
            (read, []),
            (take, [round(lease * 1_000_000)]),
            _COMMIT,
        ], keep=[2])
        if not rows:
            return []
        now = _utc(rows[0][10])
        lease_expires_at = now + timedelta(microseconds=round(lease * 1_000_000))
        headers, utc = BatchHeaders(), BatchTimes(_utc)  # the driver's are naive UTC

        def decode(r: Any) -> Delivery:
            return Delivery(
                id=r[0],
                queue=r[1],
                headers=headers(r[2]),
                payload=bytes(r[3]),
                attempts=r[4],
                deliveries=r[5] + 1,
                created_at=utc(r[6]),
                first_attempt_at=now if r[7] is None else utc(r[7]),
                acquired_at=now,
                lease_expires_at=lease_expires_at,
                scheduled_at=utc(r[8]),
                history=decode_history(r[9]),
            )

        out = decode_rows(rows, decode, _undecodable)
        out.sort(key=ready_order)
        return out

    async def settle(self, settlements: Sequence[Settlement]) -> set[int]:
        if not settlements:
            return set()
        sql = self._settle_sql
        # The batch drives the locking join in its own order: by id, as extend's, so that a
        # flush and a lease renewal of the same rows cannot deadlock.
        batch = sorted(settlements, key=_settlement_id)
        packet: list[tuple[str, Sequence[Any]]] = [
            _BEGIN, (sql["set"], [self.settlement_json(batch)]), (sql["lock"], []),
        ]
        outcomes = {s.outcome.value for s in settlements}
        if outcomes & {"COMPLETED", "FAILED"}:
            packet += [(sql["archive"], []), (sql["delete"], [])]
        if outcomes & {"RETRY", "RELEASE"}:
            packet.append((sql["update"], []))
        packet += [(sql["clear"], []), _COMMIT]
        (locked,) = await self._packet(packet, keep=[2])
        return {r[0] for r in locked}

    async def _packet(self, statements: list[tuple[str, Sequence[Any]]],
                      keep: Sequence[int]) -> list[list[Any]]:
        """``statements`` in one packet on a kept autocommit connection (a transaction, when
        they open and commit one themselves); the rows of the statements at ``keep``."""
        conn = await self._checkout()
        try:
            results = await _run(conn, statements, self._multi)
        except BaseException:
            # Whatever failed, the server may hold the transaction open: closing the
            # connection ends it, with its locks.
            await discard(conn)
            raise
        await self._checkin(conn)
        return [results[i] for i in keep]

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        if not leases:
            return set()
        async with self.db.begin() as conn:
            held = (
                await conn.execute(
                    self.sql(_EXTEND_LOCK),
                    {"leases": json.dumps([list(x) for x in sorted(leases)])},  # as settle
                )
            ).scalars().all()
            if held:
                await conn.execute(
                    self._extend, {"ids": list(held), "us": int(seconds * 1_000_000)}
                )
            return set(held)

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        async with self.db.connect() as conn:
            # One recoverer at a time; GET_LOCK belongs to the session, not the transaction,
            # so it is released by hand (or by the server when the connection dies).
            key = {"key": self.recovery_lock}
            if (await conn.execute(text("SELECT GET_LOCK(:key, 0)"), key)).scalar() != 1:
                await conn.rollback()
                return []
            try:
                ids = (await conn.execute(self.sql(_EXPIRED), {"limit": limit})).scalars().all()
                if ids:
                    await conn.execute(self._recover, {"ids": list(ids), "spread": spread})
                await conn.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.rollback()
                raise
            finally:
                try:
                    await conn.execute(text("SELECT RELEASE_LOCK(:key)"), key)
                    await conn.commit()
                except Exception:
                    # Never return a connection that may still hold the lock to the pool.
                    await conn.invalidate()
                    raise
            return list(ids)


async def _run(
    conn: AsyncConnection, statements: Sequence[tuple[str, Sequence[Any]]], multi: bool,
) -> list[list[Any]]:
    """Run ``statements`` in order on the driver's own connection under ``conn`` and return
    each one's rows; with ``multi`` they travel in one packet.

    A failure leaves the connection in a state nobody should reuse (results half read, a
    transaction the server may have ended), so it is invalidated, and a driver error comes
    out wrapped as SQLAlchemy's, like the other statements' errors.
    """
    sql = ";\n".join(q for q, _ in statements)
    try:
        cursor = (await driver_connection(conn)).cursor()
        results: list[list[Any]] = []
        if multi:
            await cursor.execute(sql, [a for _, args in statements for a in args])
            results.append(list(await cursor.fetchall() or ()))
            while await cursor.nextset():
                results.append(list(await cursor.fetchall() or ()))
        else:
            for query, args in statements:
                await cursor.execute(query, list(args))
                results.append(list(await cursor.fetchall() or ()))
    except BaseException as exc:
        with contextlib.suppress(Exception):
            await conn.invalidate()
        if isinstance(exc, Exception) and not isinstance(exc, DBAPIError):
            raise DBAPIError.instance(sql, None, exc, Exception,
                                      dialect=conn.engine.dialect) from exc
        raise
    if len(results) != len(statements):
        await conn.invalidate()
        raise RuntimeError(f"{len(statements)} statements gave {len(results)} results")
    return results


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)


def _undecodable(r: Any, exc: BaseException) -> Delivery:
    return undecodable_delivery(r[0], r[1], r[4], r[5] + 1, exc)


def _loads(value: object) -> object:
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value


def _settlement_id(s: Settlement) -> int:
    return s.id
