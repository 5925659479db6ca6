"""Keeping an SQLite file's write-ahead log from growing without end under steady load.

SQLite checkpoints the log into the database file once a commit takes it past 1,000 pages,
but the log starts over (its file written again from the start) only when a writer begins
after a checkpoint copied all of it, while no reader still reads it. An engine lets its
next writer in as soon as the previous one sends its COMMIT (:mod:`.connections`),
so under steady load a writer has always begun before the checkpoint that follows a commit
ends: the log never started over, and its file grew with every message handled (from 4.3
to 15.7 MB through a drain of 100,000 messages, to 149 MB through 20,000 of 1,000 ordered
channels) and kept that size. So once the file passes :data:`LOG_LIMIT`, the engine checkpoints in
``TRUNCATE`` mode inside its write turn, where no writer of its process has begun; kept
waiting over 50 ms (another process's reader or writer, the commit before it still
checkpointing), it gives up and tries again :data:`RETRY_AFTER` later, then twice as long
after each try that gave up."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from ...backoff import FailureRun
from ..sql.kept_connections import driver_connection
from . import statements as sql
from .connections import NO_BUSY_WAIT, write_turn
from .rows import fetch, no_busy_wait

T = TypeVar("T")

#: The log file's size past which the engine truncates it (SQLite's own checkpoint runs at
#: 1,000 pages, 4 MB of 4 KB pages).
LOG_LIMIT = 16 * 1024 * 1024
#: How long after a truncation that gave up the next is tried, doubling while they give up
#: (a long reader elsewhere would otherwise cost this process's writers 50 ms every
#: RETRY_AFTER), up to RETRY_MOST.
RETRY_AFTER = 0.25
RETRY_MOST = 30.0


class LogBound:
    """When the log of the database file ``path`` is due a truncation (None: an in-memory
    or URI-named database, none)."""

    def __init__(self, path: str | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        file = bool(path) and path != ":memory:" and not str(path).startswith("file:")
        self.log = f"{path}-wal" if file else None
        self._not_before = 0.0
        self._pause = 0.0
        self.failures = FailureRun(f"truncating the SQLite log of {path}")

    def due(self) -> bool:
        """Whether the log file is past :data:`LOG_LIMIT` (a ``stat``, about 2 µs)."""
        if self.log is None or self._clock() < self._not_before:
            return False
        try:
            return os.stat(self.log).st_size > LOG_LIMIT
        except OSError:
            return False

    def ran(self, busy: bool) -> None:
        """A truncation ran; ``busy``: another process kept it from completing."""
        self._pause = min(max(RETRY_AFTER, 2 * self._pause), RETRY_MOST) if busy else 0.0
        self._not_before = self._clock() + self._pause


class LogTruncation:
    """The truncation, for :class:`~.engine.SqliteEngine`: after each transaction of
    :meth:`_transaction` (the channels' acquires, the passing settles) and each plain
    settle (:meth:`_bound_log`)."""

    db: Any
    _log: LogBound

    if TYPE_CHECKING:
        async def _checkout(self) -> AsyncConnection: ...

        async def _checkin(self, conn: AsyncConnection) -> None: ...

        async def _discard(self, conn: AsyncConnection, exc: BaseException) -> None: ...

    async def _transaction(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        out: T = await super()._transaction(work)  # type: ignore[misc]
        await self._bound_log()
        return out

    async def _bound_log(self) -> None:
        """Truncate the log if it is past its limit, inside this process's write turn. A
        failure is logged (the first of a run), not raised: the transaction before it
        committed."""
        log = self._log
        if not log.due():
            return
        conn = await self._checkout()
        try:
            await no_busy_wait(conn)
            raw = await driver_connection(conn)
            busy = 0
            async with write_turn(self.db):
                if log.due():  # not truncated meanwhile by a caller before this one
                    await raw.execute(sql.LOG_TRUNCATE_WAIT)
                    try:
                        ((busy, *_),) = await fetch(conn, sql.LOG_TRUNCATE, {})
                    finally:
                        await raw.execute(NO_BUSY_WAIT)
        except Exception as exc:
            await self._discard(conn, exc)
            log.ran(busy=True)
            log.failures.note(exc, "tried again later")
            return
        except BaseException as exc:
            await self._discard(conn, exc)
            raise
        await self._checkin(conn)
        log.ran(busy=bool(busy))
        log.failures.succeeded()


__all__ = ["LOG_LIMIT", "RETRY_AFTER", "RETRY_MOST", "LogBound", "LogTruncation"]
