"""MySQL 8 and MariaDB 10.6+: no ``UPDATE … RETURNING``, so acquire is a short transaction
(``SELECT … FOR UPDATE SKIP LOCKED``, then one ``UPDATE``). A settle batch travels as one
JSON value, opened with ``JSON_TABLE``; its rows are locked first so that copying to the
archive and deleting see the same rows. Sessions run READ COMMITTED (set in
:mod:`sqlmq.connect`) to keep gap locks out of the way of other consumers.

The hot path (acquire, settle) sends each transaction's statements in one packet, straight
on the driver (asyncmy always allows multi-statements), and reads plain tuples: a round
trip per statement and SQLAlchemy's per-row result processing were most of a drain's time.
The locked ids stay on the server in a session variable between the statements, so nothing
has to come back to the client in between. The statements are in
:mod:`sqlmq.engines.mysql.statements`.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from ...errors import SchemaError
from ...records import Delivery, NewMessage, NewMessages, Settlement, expiry_from
from ...schema import MAX_PRIORITY, MAX_QUEUE_NAME
from ..sql.drivers import AsyncDriverConnection
from ..sql.engine import ARCHIVING, RETURNING, ArchiveAndStatsMixin, SqlEngine
from ..sql.fair import Lookouts, Transaction
from ..sql.kept_connections import driver_connection
from ..sql.rows import (
    BatchHeaders,
    BatchHeaderTexts,
    BatchTimes,
    decode_history,
    decode_rows,
    leased_delivery,
    ready_order,
    undecodable_delivery,
)
from ..sql.settle_onward import needs_onward
from ..sql.statements import channel_fields, render
from . import statements as sql
from .search import MysqlSearch

#: JSON_ARRAYAGG is cut at ``group_concat_max_len`` bytes on MariaDB (and its results were
#: cut at 64 KiB by MDEV-37835); an id takes at most 21 (19 digits, a comma and a space), so
#: an acquire takes at most as many rows as fit below both.
_ID_LIST = 65_535
_ID_BYTES = 21



def placeholders(count: int) -> str:
    """``%s, %s, …``: one driver parameter per queue, for ACQUIRE_LOCK's ``{queues}``."""
    return ", ".join(["%s"] * count)


@dataclass(frozen=True)
class AcquireStatements:
    """An acquire packet's statements for a number of queues, but for BEGIN and COMMIT
    (see ACQUIRE_LEVEL in the SQL file): one priority level's ready rows locked, read and
    taken, then the level and the next one below it read. Shared by the engine's acquire
    and the Spark ledger's lease (which records the taken ids before reading them)."""

    level: str
    lock: str
    read: str
    take: str
    next_level: str

    def statements(self, queues: Sequence[str], below: int, limit: int,
                   lease: float) -> list[tuple[str, list[Any]]]:
        """The statements with their parameters: the highest level below ``below``, up to
        ``limit`` of its ready rows locked into ``@sqlmq_take``, read, and leased for
        ``lease`` seconds, then ACQUIRE_LEVELS_READ's row."""
        return [(self.level, [a for q in queues for a in (q, below)]),
                (self.lock, [*queues, limit]),
                (self.read, []),
                (self.take, [round(lease * 1_000_000)]),
                (self.next_level, list(queues)),
                (sql.ACQUIRE_LEVELS_READ, [])]


def acquire_statements(names: Mapping[str, object], queues: int) -> AcquireStatements:
    """The acquire statements for ``queues`` queues (see ACQUIRE_LEVEL in the SQL file)."""
    def level(into: str, below: str) -> str:
        one = render(sql.ACQUIRE_LEVEL_OF_QUEUE, {**names, "below": below})
        return render(sql.ACQUIRE_LEVEL,
                      {"level": into, "of_queues": sql.UNION_ALL.join([one] * queues)})

    return AcquireStatements(
        level("@sqlmq_level", "%s"),
        render(sql.ACQUIRE_LOCK, {**names, "queues": placeholders(queues)}),
        render(sql.ACQUIRE_READ, names), render(sql.ACQUIRE_TAKE, names),
        level("@sqlmq_next", "@sqlmq_level"))


#: A batch's INSERT_MANY statements: at most this many rows, or this many bytes of headers
#: and payloads, each; up to _PACKET_BYTES in all, the whole batch travels in one packet
#: (escaped, a payload may double: MariaDB's max_allowed_packet is 16 MiB by default).
_MANY_ROWS = 5000
_MANY_BYTES = 1 << 20
_PACKET_BYTES = 4 << 20
#: The server ended the transaction to break a deadlock (ER_LOCK_DEADLOCK).
_ER_LOCK_DEADLOCK = 1213

#: Above every priority: the first packet's bound.
TOP_LEVEL = MAX_PRIORITY + 1


def take_limit(group_concat_max_len: int | None) -> int:
    """The most ids one acquire may take (see ``_ID_LIST``), given MariaDB's
    ``group_concat_max_len`` (``None`` on MySQL)."""
    limit = _ID_LIST if group_concat_max_len is None else min(_ID_LIST, group_concat_max_len)
    return max(1, limit // _ID_BYTES)


def _returning(db: AsyncEngine | None) -> bool:
    """Whether the server has INSERT … RETURNING: MariaDB, not MySQL 8 (known once a
    connection has been made; until then, batches take the general path)."""
    return db is not None and bool(getattr(db.dialect, "is_mariadb", False))


class IdLists:
    """How many ids one acquire may carry in a session variable (JSON_ARRAYAGG), asked
    of the server once: the plain acquire's and the fair acquire's batch bound."""

    db: AsyncEngine
    _max_batch: int | None
    _checkout: Callable[[], Awaitable[AsyncConnection]]
    _checkin: Callable[[AsyncConnection], Awaitable[None]]
    _discard: Callable[..., Awaitable[None]]

    async def _max_ids(self) -> int:
        """The most ids one acquire may take (asked once, see _id_list_limit)."""
        if self._max_batch is None:
            conn = await self._checkout()
            try:
                self._max_batch = await self._id_list_limit(conn)
            except BaseException as exc:
                await self._discard(conn, exc)
                raise
            await self._checkin(conn)
        return self._max_batch

    async def _id_list_limit(self, conn: AsyncConnection) -> int:
        """The most ids one acquire may gather in its session variable (see _ID_LIST)."""
        concat = None
        if getattr(self.db.dialect, "is_mariadb", False):
            (rows,) = await _run(conn, [(sql.GROUP_CONCAT_MAX_LEN, [])], False)
            concat = int(rows[0][0])
        return take_limit(concat)


def _channel_fields(names: dict[str, object], queues: int | None = None) -> dict[str, object]:
    """The fields of the channel statements (the fair acquire's and the passing settle's)
    besides the tables': the fair key's parts, the channel name's length, and, for a
    statement built per number of queues, their placeholders."""
    fields = {**channel_fields(names), "name_length": MAX_QUEUE_NAME}
    if queues is not None:
        fields["queues"] = placeholders(queues)
    return fields


class FairPacket:
    """The fair acquire of channels without limits on MySQL and MariaDB (see
    :mod:`..sql.fair`), in one packet as the plain acquire: the generic path's four
    statements and their Python cost about a quarter of the 1,000-channel drain."""

    names: dict[str, object]
    _fair_spread: dict[tuple[str, ...], int]
    _packet: Callable[..., Awaitable[list[list[Any]]]]
    _max_ids: Callable[[], Awaitable[int]]

    @cached_property
    def _fair_picks(self) -> dict[int, str]:
        """FAIR_PICK by number of queues (rendered once per count)."""
        return {}

    @cached_property
    def _fair_rest(self) -> list[str]:
        names = _channel_fields(self.names)
        return [render(sql.FAIR_LOCK, names), render(sql.FAIR_READ, names),
                render(sql.FAIR_TAKE, names), render(sql.FAIR_CLOCK, names),
                render(sql.FAIR_LET_IN, names)]

    async def _acquire_fair(self, queues: Sequence[str], limit: int,
                            lease: float) -> list[Delivery]:
        most = min(limit, await self._max_ids())
        pick = self._fair_picks.get(len(queues))
        if pick is None:
            pick = self._fair_picks[len(queues)] = render(
                sql.FAIR_PICK, _channel_fields(self.names, len(queues)))
        lock, read, take, clock, let_in = self._fair_rest
        (rows,) = await self._packet(
            [(sql.BEGIN, ()), (pick, [*queues, most]),
             (lock, ()), (read, ()), (take, [round(lease * 1_000_000)]), (clock, ()),
             (let_in, ()), (sql.COMMIT, ())], keep=[3])
        rows = sorted(rows, key=lambda r: (r[17], r[0]))
        out = _deliveries(rows, lease)
        for d, r in zip(out, rows, strict=True):
            d.channel = r[16]
            d.holds_slot = d.passes_slot = bool(r[18])
        self._fair_spread[tuple(queues)] = len({r[16] for r in rows})
        return out


class SlotPacket:
    """``settle_passing`` on MySQL and MariaDB (see :mod:`..sql.slots`) in one packet: the
    settle's statements with the room of each channel read between its lock and its
    writes, then each channel's next messages locked, read and taken. The generic path's
    five statements after the settle, each a round trip, cost 4-5 ms of a 10 ms slot."""

    names: dict[str, object]
    _packet: Callable[..., Awaitable[list[list[Any]]]]
    _max_ids: Callable[[], Awaitable[int]]
    _settle_statements: Callable[[Sequence[Settlement]], list[tuple[str, Sequence[Any]]]]
    settle: Callable[[Sequence[Settlement]], Awaitable[set[int]]]
    _lookouts: Lookouts
    _transaction: Transaction

    @cached_property
    def _pass_statements(self) -> tuple[str, str, str, str, str]:
        """PASS_ROOM, PASS_HEADS_LOCK, PASS_READ, PASS_TAKE and FAIR_LET_IN, rendered
        once."""
        names = _channel_fields(self.names)
        return (render(sql.PASS_ROOM, names), render(sql.PASS_HEADS_LOCK, names),
                render(sql.PASS_READ, names), render(sql.PASS_TAKE, names),
                render(sql.FAIR_LET_IN, names))

    @cached_property
    def _pass_heads_rendered(self) -> dict[int, str]:
        """PASS_HEADS by number of queues (rendered once per count). Not named after the
        statement: ``_pass_heads`` is :class:`~..sql.fair.FairAcquire`'s method, which the
        generic ``settle_passing`` calls for an onward settle (a defer, a cancel, outputs)."""
        return {}

    def _pass_heads_of(self, queues: int) -> str:
        heads = self._pass_heads_rendered.get(queues)
        if heads is None:
            heads = self._pass_heads_rendered[queues] = render(
                sql.PASS_HEADS, _channel_fields(self.names, queues))
        return heads

    @cached_property
    def _pass_picks(self) -> dict[tuple[int, int], str]:
        """PASS_PICK by numbers of queues and channels (rendered once per pair)."""
        return {}

    def _pass_pick(self, queues: int, channels: int) -> str:
        pick = self._pass_picks.get((queues, channels))
        if pick is None:
            names = _channel_fields(self.names, queues)
            part = render(sql.PASS_PICK_PART, names)
            pick = self._pass_picks[queues, channels] = render(sql.PASS_PICK, {
                **names, "parts": sql.UNION_ALL.join([part] * channels)})
        return pick

    async def settle_passing(self, settlements: Sequence[Settlement],
                             slots: Mapping[int, str], queues: Sequence[str], lease: float,
                             most: int) -> tuple[set[int], list[Delivery]]:
        if needs_onward(settlements):
            return await super().settle_passing(  # type: ignore[misc]
                settlements, slots, queues, lease, most)
        bounds = pass_bounds([slots[s.id] for s in settlements if s.id in slots],
                             min(most, await self._max_ids()))
        if not bounds:
            return await self.settle(settlements), []
        room, lock_heads, read, take, let_in = self._pass_statements
        held = json.dumps([[s.id, s.deliveries, slots[s.id]] for s in settlements
                           if s.id in slots])
        settle = self._settle_statements(settlements)
        packet = [(sql.BEGIN, ()), *settle[:2], (room, [held]), *settle[2:],
                  (self._pass_pick(len(queues), len(bounds)),
                   [a for channel, n in bounds.items() for a in (channel, *queues, n)])]
        # An ordered channel's turn, passed within the bounds too (most in all); left out
        # while no ordered channel was seen: 1.2-1.7 ms less of the server's time.
        ordered = await self._lookouts.ordered.sees(self._transaction)
        if ordered:
            heads = json.dumps([[s.id, s.deliveries, slots[s.id]] for s in settlements
                                if slots.get(s.id) in bounds])
            packet += [(self._pass_heads_of(len(queues)), [heads, *queues]), (lock_heads, ())]
        read_at = len(packet)
        packet += [(read, ()), (take, [round(lease * 1_000_000)])]
        if ordered:
            packet.append((let_in, ()))
        packet.append((sql.COMMIT, ()))
        locked, rows = await self._packet(packet, keep=[2, read_at])
        rows.sort(key=lambda r: r[0])
        out = _deliveries(rows, lease)
        for d, r in zip(out, rows, strict=True):
            d.channel, d.holds_slot, d.passes_slot = r[16], True, True
        return {r[0] for r in locked}, out


def pass_bounds(channels: Sequence[str], most: int) -> dict[str, int]:
    """The most each channel among ``channels`` (one entry per result that held one of its
    slots) could pass on, ``most`` in all: PASS_PICK's bound on what it locks."""
    bounds: dict[str, int] = {}
    for channel in sorted(channels):
        if most <= 0:
            break
        bounds[channel] = bounds.get(channel, 0) + 1
        most -= 1
    return bounds


class MysqlEngine(SlotPacket, FairPacket, IdLists, MysqlSearch, ArchiveAndStatsMixin,
                  SqlEngine):
    """The contract on MySQL 8 and MariaDB."""

    hands_over = True
    DATABASE = "mysql"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = self.names
        ids = bindparam("ids", expanding=True)
        self._extend_lock = text(render(sql.EXTEND_LOCK, names))
        self._extend = text(render(sql.EXTEND, names)).bindparams(ids)
        self._expired = text(render(sql.RECOVER_EXPIRED_LOCK, names))
        self._recover = text(render(sql.RECOVER_EXPIRED, names)).bindparams(ids)
        # the acquire's levels and lock, by number of queues
        self._lock_ready: dict[int, AcquireStatements] = {}
        self._settle_input = render(sql.SETTLE_INPUT, names)
        self._settle_lock = render(sql.SETTLE_LOCK, names)
        self._settle_archive = render(sql.SETTLE_ARCHIVE, names)
        self._settle_delete = render(sql.SETTLE_DELETE, names)
        self._settle_update = render(sql.SETTLE_UPDATE, names)
        self._keep_results_sql = render(sql.KEEP_RESULTS, names)
        self._insert_one_sql = render(sql.INSERT_ONE, names)
        self._insert_leased_sql = render(sql.INSERT_LEASED, names)
        self._max_batch: int | None = None
        self._insert_many_full: str | None = None
        # asyncmy always allows several statements per packet; another driver (aiomysql, on
        # an engine the caller built) gets them one at a time, in the same transaction.
        self._multi = self.url.get_driver_name() == "asyncmy"

    def _acquire_lock(self, queues: int) -> AcquireStatements:
        """The acquire's levels and lock for this many queues (rendered once per count)."""
        statements = self._lock_ready.get(queues)
        if statements is None:
            statements = self._lock_ready[queues] = acquire_statements(self.names, queues)
        return statements

    # ---- publishing ----------------------------------------------------------------------

    async def publish(
        self, messages: NewMessages,
        executor: AsyncConnection | AsyncSession | AsyncDriverConnection | None = None,
    ) -> list[int]:
        """One message due after a delay, on sqlmq's own connection: INSERT_ONE on a kept
        connection, one round trip, the INSERT committing itself (the general path's pool
        checkout, INSERT and COMMIT take three). A batch on MariaDB's own connection: see
        ``_publish_many``. Anything else (the caller's transaction, deduplication keys,
        MySQL 8's batches) through SQLAlchemy Core (see :mod:`..sql.publish`)."""
        if executor is not None or messages.core_only:
            return await self._publish_core(messages, executor)
        if len(messages) > 1 and _returning(self._db):
            return await self._publish_many(messages)
        if len(messages) == 1 and messages.at is None:
            message = messages[0]
            delay = round(message.delay * 1_000_000)
            args = [message.queue, json.dumps(message.headers), message.payload, delay,
                    message.priority, *_expiry(message)]
            ((row,),) = await self._packet([(self._insert_one_sql, args), (sql.LAST_ID, ())],
                                           keep=[1])
            return [int(row[0])]
        return await self._publish_core(messages, executor)

    async def _publish_many(self, messages: NewMessages) -> list[int]:
        """A batch (one queue, schedule and priority) in one transaction on a kept
        connection: INSERT_MANY_SHARED, then an INSERT_MANY per ``_MANY_ROWS`` rows or
        ``_MANY_BYTES`` of headers and payloads. Up to ``_PACKET_BYTES`` in one packet, else
        a statement at a time (the server's max_allowed_packet)."""
        at = messages.at
        when = ((sql.INSERT_MANY_DELAY, [round(messages.delay * 1_000_000)]) if at is None
                else (sql.INSERT_MANY_AT, [_stored(at)]))
        statements: list[tuple[str, Sequence[Any]]] = [
            (sql.BEGIN, ()),
            (sql.INSERT_MANY_SHARED, [messages.queue, messages.priority, *_expiry(messages)]),
            when]
        encoded = BatchHeaderTexts()
        args: list[Any] = []
        size = total = 0
        for payload, h in zip(messages.payloads, messages.headers, strict=True):
            headers = encoded(h)
            args += (headers, payload)
            size += len(headers) + len(payload)
            if len(args) == 2 * _MANY_ROWS or size >= _MANY_BYTES:
                statements.append((self._insert_many(len(args) // 2), args))
                args, total, size = [], total + size, 0
        if args:
            statements.append((self._insert_many(len(args) // 2), args))
        statements.append((sql.COMMIT, ()))
        results = await self._packet(statements, keep=range(3, len(statements) - 1),
                                     one_packet=total + size < _PACKET_BYTES)
        return sorted(int(row[0]) for rows in results for row in rows)

    def deadlock_victim(self, exc: BaseException) -> bool:
        args = getattr(exc.orig if isinstance(exc, DBAPIError) else exc, "args", None)
        return bool(args) and args[0] == _ER_LOCK_DEADLOCK

    def _insert_many(self, rows: int) -> str:
        """INSERT_MANY for this many rows (the full chunk's statement is kept)."""
        if rows == _MANY_ROWS and self._insert_many_full is not None:
            return self._insert_many_full
        statement = render(sql.INSERT_MANY, {
            **self.names, "rows": sql.ROWS_SEPARATOR.join([sql.INSERT_MANY_ROW] * rows)})
        if rows == _MANY_ROWS:
            self._insert_many_full = statement
        return statement

    async def publish_leased(self, message: NewMessage, lease: float) -> Delivery | None:
        """One message published already acquired, for a local subscriber (None: paused)."""
        us = round(lease * 1_000_000)
        ((row,),) = await self._packet([
            (sql.INSERT_LEASED_CLOCK, ()),
            (self._insert_leased_sql,
             [message.queue, json.dumps(message.headers), message.payload, us,
              message.priority, *_expiry(message), message.queue]),
            (sql.INSERT_LEASED_READ, ()),
        ], keep=[2])
        if row[0] is None:
            return None
        now = _utc(row[1])
        return leased_delivery(message, int(row[0]), now, now + timedelta(microseconds=us),
                               expiry_from(message, now))

    # ---- consuming -----------------------------------------------------------------------

    async def _acquire_plain(self, queues: Sequence[str], limit: int,
                             lease: float) -> list[Delivery]:
        lock, want = self._acquire_lock(len(queues)), min(limit, await self._max_ids())
        out: list[Delivery] = []
        below = TOP_LEVEL
        while True:  # a packet per priority level, while levels below have rows to give
            rows, ((level, below_it),) = await self._packet(
                [(sql.BEGIN, ()), *lock.statements(queues, below, want, lease),
                 (sql.COMMIT, ())], keep=[3, 6])
            out += _deliveries(rows, lease)
            want -= len(rows)
            if want <= 0 or below_it is None:
                break
            below = level
        out.sort(key=ready_order)
        return out

    async def _settle_alone(self, settlements: Sequence[Settlement]) -> set[int]:
        if not settlements:
            return set()
        packet = [(sql.BEGIN, ()), *self._settle_statements(settlements), (sql.COMMIT, ())]
        (locked,) = await self._packet(packet, keep=[2])
        return {r[0] for r in locked}

    async def _write_results(self, conn: AsyncConnection,
                             kept: list[tuple[int, bytes]]) -> None:
        """One statement for all of them (KEEP_RESULTS): the results as base64 in JSON."""
        listed = json.dumps([[i, base64.b64encode(r).decode()] for i, r in kept])
        await conn.exec_driver_sql(self._keep_results_sql, (listed,))

    async def _settle_in(self, conn: AsyncConnection,
                         settlements: Sequence[Settlement]) -> set[int]:
        results = await _run(conn, self._settle_statements(settlements), self._multi)
        return {r[0] for r in results[1]}

    def _settle_statements(self, settlements: Sequence[Settlement],
                           ) -> list[tuple[str, Sequence[Any]]]:
        """The settle of ``settlements``, without BEGIN and COMMIT; the second statement's
        rows are the ids it writes."""
        # The batch drives the locking join in its own order: by id, as extend's, so that a
        # flush and a lease renewal of the same rows cannot deadlock.
        batch = sorted(settlements, key=_settlement_id)
        statements: list[tuple[str, Sequence[Any]]] = [
            (self._settle_input, [self.settlement_json(batch)]), (self._settle_lock, ()),
        ]
        outcomes = {s.outcome for s in settlements}
        if outcomes & ARCHIVING:
            statements += [(self._settle_archive, ()), (self._settle_delete, ())]
        if outcomes & RETURNING:
            statements.append((self._settle_update, ()))
        statements.append((sql.SETTLE_CLEAR, ()))
        return statements

    async def _packet(self, statements: list[tuple[str, Sequence[Any]]],
                      keep: Sequence[int], one_packet: bool = True) -> list[list[Any]]:
        """``statements`` in one packet on a kept autocommit connection (a transaction, when
        they open and commit one themselves); the rows of the statements at ``keep``. Sent
        one at a time where the driver allows no more, or ``one_packet`` is False."""
        conn = await self._checkout()
        try:
            results = await _run(conn, statements, self._multi and one_packet)
        except BaseException as exc:
            # Whatever failed, the server may hold the transaction open: closing the
            # connection ends it, with its locks.
            await self._discard(conn, exc)
            raise
        await self._checkin(conn)
        return [results[i] for i in keep]

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        if not leases:
            return set()
        async with self.db.begin() as conn:
            held = (
                await conn.execute(
                    self._extend_lock,
                    {"leases": json.dumps([list(x) for x in sorted(leases)])},  # as settle
                )
            ).scalars().all()
            if held:
                await conn.execute(
                    self._extend, {"ids": list(held), "us": int(seconds * 1_000_000)}
                )
            return set(held)

    # ---- maintenance ---------------------------------------------------------------------

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        async with self.db.connect() as conn:
            # One recoverer at a time; GET_LOCK belongs to the session, not the transaction,
            # so it is released by hand (or by the server when the connection dies).
            key = {"key": self.recovery_lock}
            if (await conn.execute(text(sql.RECOVERY_LOCK), key)).scalar() != 1:
                await conn.rollback()
                return []
            try:
                ids = (await conn.execute(self._expired, {"limit": limit})).scalars().all()
                if ids:
                    await conn.execute(self._recover, {"ids": list(ids), "spread": spread})
                await conn.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.rollback()
                raise
            finally:
                try:
                    await conn.execute(text(sql.RECOVERY_UNLOCK), key)
                    await conn.commit()
                except Exception:
                    # Never return a connection that may still hold the lock to the pool.
                    await conn.invalidate()
                    raise
            return list(ids)

    def _migration_lock(self, conn: Connection) -> Callable[[], None]:
        key = {"key": f"sqlmq:{self.schema.prefix}"}
        if conn.execute(text(sql.MIGRATION_LOCK), key).scalar() != 1:
            raise SchemaError("timed out waiting for another sqlmq migration to finish")
        return lambda: conn.execute(text(sql.MIGRATION_UNLOCK), key)  # type: ignore[return-value]


def _deliveries(rows: list[Any], lease: float) -> list[Delivery]:
    """ACQUIRE_READ's rows as deliveries, leased from the clock reading they carry."""
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
            priority=r[11],
            expires_at=utc(r[12]),
            saved_state=None if r[13] is None else bytes(r[13]),
            defers=r[14],
            cancel_requested=bool(r[15]),
        )

    return decode_rows(rows, decode, _undecodable)


def _expiry(messages: NewMessage | NewMessages) -> tuple[datetime | None, int | None]:
    """The expiry parameters of INSERT_ONE and the others: the moment (naive UTC, as stored),
    or microseconds from the database's now."""
    at, seconds = messages.expires_at, messages.expires_in
    return (None if at is None else _stored(at),
            None if seconds is None else round(seconds * 1_000_000))


def _stored(moment: datetime) -> datetime:
    """A moment as a DATETIME(6) parameter: naive UTC."""
    return moment.astimezone(UTC).replace(tzinfo=None)


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


def _settlement_id(s: Settlement) -> int:
    return s.id
