"""SQLite: every transaction is ``BEGIN IMMEDIATE`` (set up in
:mod:`sqlmq.engines.sqlite.connections`), so a writer holds the database's single write lock from
its first statement. That serialises acquire and settle across processes sharing one file,
which is what SKIP LOCKED gives the server databases; WAL keeps readers going meanwhile.

Since one transaction at a time writes, the time a transaction takes is the throughput: the
hot path (acquire, settle, a single publish) runs its statements straight on aiosqlite, one
trip to the driver's thread each, and turns plain tuples into records after the commit. The
statements are in :mod:`sqlmq.engines.sqlite.statements`.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from ...records import Delivery, NewMessage, NewMessages, Settlement
from ..sql.drivers import AsyncDriverConnection
from ..sql.engine import ARCHIVING, RETURNING, ArchiveAndStatsMixin, SqlEngine
from ..sql.kept_connections import discard, driver_connection
from ..sql.rows import BatchHeaderTexts, leased_delivery, ready_order
from ..sql.statements import render
from . import statements as sql
from .channels import SqliteChannels
from .connections import BUSY_WAIT, refused, retry_refused, waiters_of, write_turn
from .log import LogBound, LogTruncation
from .rows import (
    _NO_BUSY_WAIT,
    decoded,
    driver_errors,
    fetch,
    no_busy_wait,
    stored_text,
    stored_time,
)
from .search import SqliteSearch


class SqliteEngine(SqliteChannels, LogTruncation, SqliteSearch, ArchiveAndStatsMixin,
                   SqlEngine):
    """The contract on SQLite."""

    AUTOCOMMIT = False  # the driver's connections already are: no BEGIN unless sent
    DATABASE = "sqlite"
    LOCK_FOR_REQUEUE = False  # BEGIN IMMEDIATE already serialises
    hands_over = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = self.names
        self._ready_sql = (render(sql.ACQUIRE_READY_QUEUES, names),
                           render(sql.ACQUIRE_READY, names))
        self._take_sql = render(sql.ACQUIRE_TAKE, names)
        self._take_channel_sql = render(sql.ACQUIRE_TAKE_CHANNEL, names)
        self._slot_limits_sql = render(sql.SLOT_LIMITS, names)
        self._due_per_channel_sql = render(sql.DUE_PER_CHANNEL, names)
        self._archive_sql = render(sql.SETTLE_ARCHIVE, names)
        self._delete_sql = render(sql.SETTLE_DELETE, names)
        self._update_sql = render(sql.SETTLE_UPDATE, names)
        self._insert_one_sql = render(sql.INSERT_ONE, names)
        self._insert_many_clock = render(sql.INSERT_MANY_CLOCK, names)
        self._insert_many_sql = render(sql.INSERT_MANY, names)
        self._insert_leased_sql = render(sql.INSERT_LEASED, names)
        self._extend = text(render(sql.EXTEND, names))
        self._recover = text(render(sql.RECOVER_EXPIRED, names))
        self._commits: CommitWatch | None = None
        self._log = LogBound(self.url.database)
        #: The queue lists whose last plain acquire found nothing ready (see _acquire_plain).
        self._found_none: set[tuple[str, ...]] = set()

    def commit_counter(self) -> Callable[[], int | None] | None:
        """SQLite's ``data_version`` of the database file (see :class:`CommitWatch`); None
        for an in-memory or URI-named database, which other processes cannot share."""
        path = self.url.database
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

    async def publish(
        self, messages: NewMessages,
        executor: AsyncConnection | AsyncSession | AsyncDriverConnection | None = None,
    ) -> list[int]:
        """One message due after a delay, on sqlmq's own connection: INSERT_ONE, straight on
        aiosqlite; a batch there: ``_publish_many``. Anything else (the caller's transaction,
        deduplication keys) through SQLAlchemy Core (see :mod:`..sql.publish`)."""
        if executor is None and not messages.core_only:
            if len(messages) == 1 and messages.at is None:
                return [await self._insert_one(messages[0])]
            if len(messages) > 1:
                return await self._publish_many(messages)
        return await self._publish_core(messages, executor)

    async def _publish_many(self, messages: NewMessages) -> list[int]:
        """A batch (one queue, schedule and priority) in one transaction, straight on
        aiosqlite: the clock read once, the driver's executemany, the last id (see
        INSERT_MANY). SQLAlchemy's per-row parameter processing was most of a batch's
        client time."""
        at = stored_text(messages.at)
        headers = BatchHeaderTexts()
        queue, priority = messages.queue, messages.priority
        async with self.db.begin() as conn:
            ((created_at, due, expires_at),) = await fetch(
                conn, self._insert_many_clock,
                {"at": at, "delay": messages.delay, **_expiry(messages)})
            rows = [{"queue": queue, "headers": headers(h), "payload": payload,
                     "created_at": created_at, "next_attempt_at": due, "priority": priority,
                     "expires_at": expires_at}
                    for payload, h in zip(messages.payloads, messages.headers, strict=True)]
            with driver_errors(conn, self._insert_many_sql):
                await (await driver_connection(conn)).executemany(self._insert_many_sql, rows)
            ((last,),) = await fetch(conn, sql.LAST_ID, {})
        return list(range(last - len(messages) + 1, last + 1))

    async def _insert_one(self, message: NewMessage) -> int:
        """Publish one message (``at`` unset) in its own transaction, straight on aiosqlite."""
        params = {"queue": message.queue, "headers": json.dumps(message.headers),
                  "payload": message.payload, "delay": message.delay,
                  "priority": message.priority, **_expiry(message)}
        ((msg_id,),) = await self._alone(self._insert_one_sql, params)
        return int(msg_id)

    async def _alone(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        """One statement that commits by itself, on a kept connection, in this process's
        write turn: one trip to the driver's thread, where BEGIN IMMEDIATE, the statement
        and COMMIT take three (and a pool checkout a rollback more)."""
        conn = await self._checkout()
        try:
            await no_busy_wait(conn)
            async with write_turn(self.db):
                rows = await retry_refused(lambda: fetch(conn, sql, params),
                                           waiters_of(self.db))
        except BaseException as exc:
            await self._discard(conn, exc)
            raise
        await self._checkin(conn)
        return rows

    async def _release(self, conn: AsyncConnection) -> None:
        """A kept connection goes back to the pool with SQLite's busy handler on again, as
        the pool's other users (reads outside a write transaction) expect it."""
        if conn.info.pop(_NO_BUSY_WAIT, None):
            try:
                await (await driver_connection(conn)).execute(BUSY_WAIT)
            except Exception:
                await discard(conn)
                return
        await conn.close()

    async def publish_leased(self, message: NewMessage, lease: float) -> Delivery | None:
        """Publish one message already acquired, for a subscriber of this process; None
        (nothing written) if its queue is paused."""
        params = {"queue": message.queue, "headers": json.dumps(message.headers),
                  "payload": message.payload, "lease": lease, "priority": message.priority,
                  **_expiry(message)}
        found = await self._alone(self._insert_leased_sql, params)
        if not found:
            return None
        ((msg_id, created_at, lease_expires_at, expires_at),) = found
        return leased_delivery(message, int(msg_id), stored_time(created_at),
                               stored_time(lease_expires_at),
                               None if expires_at is None else stored_time(expires_at))

    async def _acquire_plain(self, queues: Sequence[str], limit: int,
                             lease: float) -> list[Delivery]:
        # One queue reads the ready index in order; a list of queues (json_each) makes
        # SQLite sort every ready row of the backlog on each acquire.
        if len(queues) == 1:
            ready_sql, params = self._ready_sql[1], {"queue": queues[0], "limit": limit}
        else:
            ready_sql, params = self._ready_sql[0], {"queues": json.dumps(list(queues)),
                                                     "limit": limit}
        key = tuple(queues)
        if key in self._found_none and not await self._any_ready(ready_sql, params):
            return []
        async with self.db.begin() as conn:
            ready = await fetch(conn, ready_sql, params)
            if not ready:
                self._found_none.add(key)
                return []
            rows = await fetch(conn, self._take_sql,
                               {"ids": json.dumps([r[0] for r in ready]), "lease": lease})
        self._found_none.discard(key)
        out = decoded(rows, dict(ready))
        out.sort(key=ready_order)
        return out

    async def _any_ready(self, ready_sql: str, params: Mapping[str, Any]) -> bool:
        """Whether a plain message is ready, read without the write lock (a WAL reader
        waits for no writer). Asked after an acquire that found none: in a queue of channel
        messages only, every other acquire's plain part found nothing, and each took the
        write lock to learn it, waiting behind the settles (11 ms each in a drain of 1,000
        ordered channels, the channels' part of the same acquire waiting behind it). What
        is published after this read waits for the next acquire, as it would after a
        write transaction that found nothing."""
        conn = await self._checkout()
        try:
            found = await fetch(conn, ready_sql, {**params, "limit": 1})
        except Exception as exc:
            if not refused(exc):
                await self._discard(conn, exc)
                raise
            found = [exc]  # busy (a log being recovered): the write transaction will know
        except BaseException as exc:
            await self._discard(conn, exc)
            raise
        await self._checkin(conn)
        return bool(found)

    async def _settle_alone(self, settlements: Sequence[Settlement]) -> set[int]:
        if not settlements:
            return set()
        # the batch's JSON made before the write lock is taken, not while it is held
        params = {"input": self.settlement_json(settlements)}
        async with self.db.begin() as conn:
            applied = await self._settle_batch(conn, settlements, params)
        await self._bound_log()
        return applied

    async def _settle_in(self, conn: AsyncConnection,
                         settlements: Sequence[Settlement]) -> set[int]:
        return await self._settle_batch(conn, settlements,
                                        {"input": self.settlement_json(settlements)})

    async def _settle_batch(self, conn: AsyncConnection, settlements: Sequence[Settlement],
                            params: dict[str, str]) -> set[int]:
        outcomes = {s.outcome for s in settlements}
        applied: set[int] = set()
        if outcomes & ARCHIVING:
            await fetch(conn, self._archive_sql, params)
            applied.update(r[0] for r in await fetch(conn, self._delete_sql, params))
        if outcomes & RETURNING:
            applied.update(r[0] for r in await fetch(conn, self._update_sql, params))
        return applied

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        if not leases:
            return set()
        async with self.db.begin() as conn:
            result = await conn.execute(
                self._extend,
                {"leases": json.dumps([list(x) for x in leases]), "seconds": seconds},
            )
            return {r[0] for r in result}

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        # BEGIN IMMEDIATE already makes recoverers take turns; no lock of our own needed.
        async with self.db.begin() as conn:
            result = await conn.execute(self._recover, {"limit": limit, "spread": spread})
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
            return int(self._conn.execute(sql.DATA_VERSION).fetchone()[0])
        except sqlite3.Error:
            self.close()
            return None

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None


def _expiry(messages: NewMessage | NewMessages) -> dict[str, Any]:
    """The parameters of the SQL file's ``_EXPIRES``."""
    return {"expires_in": messages.expires_in, "expires_at": stored_text(messages.expires_at)}


