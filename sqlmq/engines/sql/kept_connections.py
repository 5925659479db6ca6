"""Connections the hot path keeps checked out of the pool, and hands on in turn.

The pool's pre-ping costs a round trip per checkout (three on PostgreSQL), and a transaction
through SQLAlchemy one more for its COMMIT; the hot path's statements commit themselves on
connections it keeps instead. Kept connections pass from a finished statement straight to
the next caller; callers beyond what the hot path may hold wait here, first come first
served, never in the pool's own queue (where they would wait for a connection the hot path
never gives back while it is busy).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import deque
from functools import cached_property
from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import Pool, QueuePool

log = logging.getLogger("sqlmq")

#: What a waiting caller is handed: a connection, or None for a place to open one in.
_Turn = asyncio.Future[AsyncConnection | None]


class IdleReturns:
    """How idle kept connections go back to the pool between the hot path's calls: by a
    timer, and when the pool's other users run out (part of :class:`KeptConnections`)."""

    db: AsyncEngine
    KEEP_FOR: float
    #: (connection, idle since), oldest first.
    _kept: list[tuple[AsyncConnection, float]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: When the oldest kept connection is due back in the pool, if any is kept.
        self._idle_timer: asyncio.TimerHandle | None = None
        #: Kept connections on their way back to the pool, outside any caller's await.
        self._returning: set[asyncio.Task[None]] = set()
        #: The pool whose checkouts :meth:`_watch_pool` follows, its capacity, the loop.
        self._watched: tuple[Pool, int, asyncio.AbstractEventLoop] | None = None

    async def _let_go(self, conn: AsyncConnection) -> None:
        raise NotImplementedError

    def _kept_one(self) -> None:
        """A connection was just kept: make sure it will go back by itself."""
        if self._idle_timer is None:
            self._arm_idle_timer()
        if self._watched is None:
            self._watch_pool()

    def _arm_idle_timer(self) -> None:
        """Call :meth:`_return_idle` when the oldest kept connection has been idle ``KEEP_FOR``:
        after a burst the hot path may not run again for hours, and its idle connections
        would stay checked out of the pool (and open on the server) all that time."""
        due = self._kept[0][1] + self.KEEP_FOR - time.monotonic()
        self._idle_timer = asyncio.get_running_loop().call_later(max(due, 0.0), self._return_idle)

    def _return_idle(self) -> None:
        self._idle_timer = None
        for conn in self._pop_idle():
            self._return_soon(conn)
        if self._kept:
            self._arm_idle_timer()

    def _pop_idle(self) -> list[AsyncConnection]:
        """The kept connections idle ``KEEP_FOR`` or more (the load no longer needs them),
        taken out of the kept ones."""
        kept, now, idle = self._kept, time.monotonic(), []
        while kept and now - kept[0][1] >= self.KEEP_FOR:
            idle.append(kept.pop(0)[0])
        return idle

    def _watch_pool(self) -> None:
        """Follow the pool's checkouts, so that idle kept connections give way to its other
        users: without it an application sharing its engine with sqlmq waited in the pool
        for connections sqlmq kept idle (up to ``KEEP_FOR`` after a burst)."""
        pool = self.db.pool
        capacity = keep_limit(pool, 0, sys.maxsize)
        self._watched = (pool, capacity, asyncio.get_running_loop())
        if capacity != sys.maxsize:  # a pool without a bound never leaves anyone waiting
            event.listen(pool, "checkout", self._on_pool_checkout)

    def _on_pool_checkout(self, *_: Any) -> None:
        """Any checkout from the pool, in whichever thread made it (SQLAlchemy's event). It
        runs inside someone else's checkout (the application's): nothing may escape it."""
        watched = self._watched
        if watched is None or not self._kept:
            return
        pool, capacity, loop = watched
        try:
            if pool.checkedout() >= capacity:  # type: ignore[attr-defined]
                loop.call_soon_threadsafe(self._give_way)
        except RuntimeError:  # the loop has closed
            pass
        except Exception:
            log.exception("sqlmq could not follow its pool's checkouts")

    def _give_way(self) -> None:
        """The pool is out of connections: the longest idle kept one goes back to it."""
        if self._kept:
            self._return_soon(self._kept.pop(0)[0])

    def _return_soon(self, conn: AsyncConnection) -> None:
        """Let ``conn`` go in a task of its own: timers and pool events cannot await."""
        task = asyncio.get_running_loop().create_task(self._let_go(conn))
        self._returning.add(task)
        task.add_done_callback(self._returned)

    def _stop_returning(self) -> None:
        """No timer and no pool events any more (an application's engine outlives the
        broker)."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._watched is not None and self._watched[1] != sys.maxsize:
            with contextlib.suppress(Exception):  # a pool SQLAlchemy has let go of
                event.remove(self._watched[0], "checkout", self._on_pool_checkout)
        self._watched = None

    async def _returned_all(self) -> None:
        if self._returning:
            await asyncio.gather(*self._returning, return_exceptions=True)

    def _returned(self, task: asyncio.Task[None]) -> None:
        self._returning.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("sqlmq could not give a kept connection back to the pool",
                      exc_info=task.exception())


class KeptConnections(IdleReturns):
    """Idle autocommit connections the hot path keeps checked out of the pool and reuses.

    As many are kept as the hot path has lately had in use at once, up to the pool's
    capacity less :attr:`KEEP_RESERVE` (:func:`keep_limit`): with four kept and a pool of
    ten, the 25 publishes a service had in flight at 2,000 msg/s (each waiting about 12 ms
    for its commit) opened and closed 25 PostgreSQL sessions a second, whose start-up cost
    the server more CPU than the publishes, which made them slower, which put more in flight
    (in-process pickup p50 0.9 ms became 30-45 ms).

    The hot path never holds more than that (in use, idle or being opened): a caller beyond
    it waits for its turn (:meth:`_checkout`) and is handed the next connection a finished
    statement gives back, or the place of one that was closed. When callers went to the
    pool for a connection instead, none was ever given back while the load lasted (a kept
    connection goes back only when more are idle than the hot path keeps): with 40 tasks
    publishing on a pool of 30, those in the pool's queue failed after its 30 s timeout
    while the others published again and again.

    A connection left idle for ``KEEP_FOR`` seconds goes back to the pool, whose pre-ping
    checks it before its next use (a server restart while it sat idle is then caught
    there), whether or not the hot path is used again (:meth:`_return_idle`); so does every
    kept connection once one fails (:meth:`_discard`). And an idle one goes back at once
    when a checkout from the pool by anyone else (the application sharing its engine,
    another broker on it) leaves the pool with nothing to give the next
    (:meth:`_watch_pool`)."""

    db: AsyncEngine

    #: Pool connections left to the rest of the broker (its listener, recoveries, reports)
    #: however many the hot path keeps.
    KEEP_RESERVE = 4
    #: Kept idle from a pool that does not say how many connections it allows (or allows
    #: any); the hot path may then hold any number.
    KEEP_UNBOUNDED = 4
    KEEP_FOR = 10.0
    #: Put the connections in autocommit; SQLite's are (see :mod:`..sqlite.connections`), and
    #: SQLAlchemy would undo that recipe when resetting the level at check-in.
    AUTOCOMMIT = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: (connection, idle since), oldest at the bottom: the newest is reused first, so
        #: those at the bottom are the ones the load no longer needs.
        self._kept: list[tuple[AsyncConnection, float]] = []
        self._kept_closed = False
        #: Connections the hot path holds from the pool: in use, kept, or being opened.
        self._held = 0
        #: Callers waiting for a connection, in the order they came.
        self._turns: deque[_Turn] = deque()

    @cached_property
    def _keep_most(self) -> int:
        """Read from the pool on first use: ``db`` is set after this class's ``__init__``."""
        return keep_limit(self.db.pool, self.KEEP_RESERVE, self.KEEP_UNBOUNDED)

    @cached_property
    def _hold_most(self) -> int:
        """How many the hot path may hold at once: in use, kept, or being opened."""
        return keep_limit(self.db.pool, self.KEEP_RESERVE, sys.maxsize)

    async def _checkout(self) -> AsyncConnection:
        if not self._turns:  # nobody came first
            kept = self._kept
            now = time.monotonic()
            while kept:
                conn, since = kept.pop()
                if now - since < self.KEEP_FOR:
                    return conn
                await self._let_go(conn)
            if self._held < self._hold_most:
                self._held += 1
                return await self._open()
        return await self._wait_turn()

    async def _wait_turn(self) -> AsyncConnection:
        turn: _Turn = asyncio.get_running_loop().create_future()
        self._turns.append(turn)
        try:
            given = await turn
        except BaseException:
            if not turn.done() or turn.cancelled():
                with contextlib.suppress(ValueError):
                    self._turns.remove(turn)
            elif turn.result() is None:  # a place, handed over as this caller gave up
                self._left()
            else:
                await self._checkin(turn.result())  # type: ignore[arg-type]
            raise
        return given if given is not None else await self._open()

    async def _open(self) -> AsyncConnection:
        """A new connection from the pool, in a place already counted in ``_held``."""
        conn: AsyncConnection | None = None
        try:
            conn = await self.db.connect()
            if self.AUTOCOMMIT:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
        except BaseException:
            if conn is None:
                self._left()
            else:
                await self._drop(conn)  # counted out before the await a second cancel may hit
            raise
        return conn

    async def _checkin(self, conn: AsyncConnection) -> None:
        turn = self._next_turn()
        if turn is not None:  # straight to whoever waits longest
            turn.set_result(conn)
            return
        for idle in self._pop_idle():
            await self._let_go(idle)
        if self._kept_closed or len(self._kept) >= self._keep_most:
            await self._let_go(conn)
        else:
            self._kept.append((conn, time.monotonic()))
            self._kept_one()

    def _left(self) -> None:
        """A connection of the hot path's is gone (or was never opened): its place goes to
        the caller waiting longest, who opens one."""
        self._held -= 1
        turn = self._next_turn()
        if turn is not None:
            self._held += 1
            turn.set_result(None)

    def _next_turn(self) -> _Turn | None:
        """The caller waiting longest, out of the line (those who gave up are skipped)."""
        while self._turns:
            turn = self._turns.popleft()
            if not turn.done():
                return turn
        return None

    async def _let_go(self, conn: AsyncConnection) -> None:
        self._left()
        with contextlib.suppress(Exception):
            await self._release(conn)

    async def _drop(self, conn: AsyncConnection) -> None:
        """Drop a connection whose call failed or was cancelled: never back into the pool as
        it is."""
        self._left()
        await discard(conn)

    async def _discard(self, conn: AsyncConnection, exc: BaseException) -> None:
        """Drop a connection whose call failed with ``exc``; if the connection was lost
        (:meth:`_disconnection`), hand the kept ones back to the pool too. What ended one
        (a server restart, a failover, a killed session) has often ended them all, and here
        each would fail a call of its own, where the pool's pre-ping replaces it unseen.
        Other errors (a missing table, a constraint) keep them: a caller repeating a bad
        publish would otherwise open them all again each time."""
        await self._drop(conn)
        if isinstance(exc, Exception) and self._disconnection(exc):
            await self._return_kept()

    def _disconnection(self, exc: Exception) -> bool:
        """Whether ``exc`` says the connection died: the dialect's own test."""
        orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
        if isinstance(orig, OSError | TimeoutError):
            return True
        try:
            return bool(self.db.dialect.is_disconnect(orig, None, None))
        except Exception:  # a dialect that cannot judge a bare driver error
            return False

    async def _close_kept(self) -> None:
        """Return the kept connections to the pool; later calls do not keep any. The pool is
        no longer followed (an application's engine outlives the broker)."""
        self._kept_closed = True
        self._stop_returning()
        await self._return_kept()
        await self._returned_all()

    async def _return_kept(self) -> None:
        while self._kept:
            await self._let_go(self._kept.pop()[0])

    async def _release(self, conn: AsyncConnection) -> None:
        """Give a connection back to the pool, as the pool's other users expect it: an
        engine that changed its session settings puts them back here."""
        await conn.close()


def keep_limit(pool: Pool, reserve: int, unbounded: int) -> int:
    """How many connections :class:`KeptConnections` may hold out of ``pool``: its capacity
    (size plus overflow) less ``reserve``, at least one; ``unbounded`` for a pool with no
    limit or none it tells (``NullPool``, ``StaticPool``)."""
    overflow = getattr(pool, "_max_overflow", -1)  # QueuePool's; it has no public reader
    if not isinstance(pool, QueuePool) or not isinstance(overflow, int) or overflow < 0:
        return unbounded
    return max(1, pool.size() + overflow - reserve)


async def driver_connection(conn: AsyncConnection) -> Any:
    """The driver's own connection under ``conn``. ``get_raw_connection`` hops through a
    greenlet (about 30 µs, paid by every hot-path statement); a connection that is open and
    not invalidated already holds its driver connection, which is read without it."""
    sync = conn.sync_connection
    if sync is not None and not sync.closed and not sync.invalidated:
        return sync.connection.driver_connection
    return (await conn.get_raw_connection()).driver_connection


async def discard(conn: AsyncConnection) -> None:
    """Drop a connection that failed: never back into the pool as it is."""
    with contextlib.suppress(Exception):
        await conn.invalidate()
    with contextlib.suppress(Exception):
        await conn.close()
