"""SQLite's connections: WAL, ``BEGIN IMMEDIATE`` for every writing transaction, and how
writers wait for one another, within a process (an asyncio lock, the *write turn*) and
across processes (a refused ``BEGIN IMMEDIATE`` tried again every millisecond or two).
Set on an engine by :func:`prepare_sqlite` when :mod:`sqlmq.connect` creates it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.exc import DBAPIError

from ...connect import READ_ONLY
from .waiters import Waiters

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")

#: Execution option marking a connection that only reads (SQLite then skips the write lock).
#: Where an engine set up by :func:`prepare_sqlite` keeps its :class:`Waiters`.
_WAITERS = "sqlmq_waiters"


def prepare_sqlite(engine: SyncEngine) -> None:
    """WAL, a long busy timeout, and ``BEGIN IMMEDIATE`` for every writing transaction,
    taken in the engine's write turn and after letting other processes' waiting writers in.

    The driver's own deferred BEGIN would let two processes both read a message as ready
    and then race to upgrade their locks; taking the write lock up front makes acquire
    exclusive instead.
    """

    waiters = engine.__dict__[_WAITERS] = Waiters(engine.url.database)
    event.listen(engine, "reset", _roll_back_if_open)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        _use_wal(cursor, engine.dialect.is_async)
        cursor.execute(BUSY_WAIT)
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()
        if engine.dialect.is_async:
            _let_statements_be_cut_short(record)

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # Reads (stats, reports) need no write lock: with one they would queue behind every
        # open writer, a caller's outbox transaction included.
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
            return
        if engine.dialect.is_async:
            _take_write_turn(engine, conn.connection.info)
        _begin_immediate(conn.connection.driver_connection, engine.dialect.is_async, waiters)

    if engine.dialect.is_async:
        @event.listens_for(engine, "commit")
        @event.listens_for(engine, "rollback")
        def _end(conn: Any) -> None:
            # These fire just before the driver's COMMIT/ROLLBACK; the next writer is let in
            # once this task yields, i.e. while that statement runs on the driver's thread.
            if conn.invalidated:
                # A task cancelled inside a statement: SQLAlchemy invalidated the connection,
                # and reading it here would raise, turning the cancellation into a
                # PendingRollbackError. The pool's invalidate event gives the turn back.
                return
            held = conn.connection.info.pop(_TURN, None)
            if held is not None:
                held[0].call_soon(held[1].release)

        # Before the turn is given back: the next writer would wait on the lock otherwise.
        event.listen(engine, "invalidate", _end_transaction_cut_short)
        for name in ("checkin", "close", "invalidate"):
            event.listen(engine, name, _give_back_write_turn)


def _roll_back_if_open(dbapi_connection: Any, record: Any, state: Any) -> None:
    """Roll back a connection the pool takes back in a transaction (the pool's own reset is
    off: ``pool_reset_on_return=None``). The pool rolled back every connection, committed or
    not: on aiosqlite one more trip to the driver's thread at the end of every transaction,
    which its caller awaits. The driver says whether a transaction is open without a trip
    (its connections autocommit: every transaction is an explicit BEGIN)."""
    if state.terminate_only or not state.asyncio_safe:
        return
    try:
        in_transaction = bool(record.driver_connection.in_transaction)
    except Exception:  # a connection closed under it: the rollback finds out
        in_transaction = True
    if in_transaction:
        dbapi_connection.rollback()


#: How long a writer waits for another to end its transaction (the busy timeout's length).
_BUSY_TIMEOUT = 60.0
_BUSY_TIMEOUT_MS = int(_BUSY_TIMEOUT * 1000)
#: Switches SQLite's busy handler off on a connection whose writes :func:`retry_refused`
#: tries again itself, and back on.
NO_BUSY_WAIT = "PRAGMA busy_timeout=0"
BUSY_WAIT = f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}"
#: The write lock taken with the busy handler off for that one statement: a refusal comes
#: back at once, and :func:`_begin_immediate` tries again itself.
_BEGIN_NOW = f"{NO_BUSY_WAIT}; BEGIN IMMEDIATE; {BUSY_WAIT}"
#: The pauses between tries: a short start, doubling up to a short cap, each jittered.
_PAUSES = (0.0002, 0.002)


def _pauses() -> Iterator[float]:
    """The pauses of a writer whose write SQLite refused (the lock was held), until the
    busy timeout has passed.

    SQLite's own busy handler sleeps 1, 2, 5, 10 ... then 100 ms between tries. Other
    processes' writers end their transactions within a millisecond and start the next one
    within a fraction of one (a process's own writers queue on the write turn instead), so
    a process waiting on the handler finds the lock free only by chance: a shared queue's
    third worker process handled none of 10,000 messages, and a single publish from a
    process of its own waited up to 2.5 s (p99 430 ms) beside two busy workers. Trying
    again every millisecond or two, a writer finds the gaps."""
    deadline = time.monotonic() + _BUSY_TIMEOUT
    pause, longest = _PAUSES
    while time.monotonic() < deadline:
        yield pause * random.uniform(0.5, 1.5)
        pause = min(pause * 2, longest)


def _locked_too_long(statement: str) -> Exception:
    """The error of a writer that waited the busy timeout out, as SQLAlchemy's (the one its
    statement would have raised had the busy handler waited)."""
    return _wrapped(sqlite3.OperationalError(
        f"database is locked: another process held the write lock for over "
        f"{_BUSY_TIMEOUT:.0f} s"), statement)


def _wrapped(exc: Exception, statement: str) -> Exception:
    """A driver's error as SQLAlchemy raises it for a statement (its own is kept)."""
    if isinstance(exc, DBAPIError) or not isinstance(exc, sqlite3.Error):
        return exc
    return DBAPIError.instance(statement, None, exc, sqlite3.Error)


def _begin_immediate(driver: Any, is_async: bool, waiters: Waiters | None = None) -> None:
    """``BEGIN IMMEDIATE``, tried again every millisecond or two while another process
    writes (see :func:`_pauses`), not left to the busy handler; after letting writers of
    other processes that wait go first (:mod:`sqlmq.engines.sqlite.waiters`)."""

    def attempt() -> None:
        # A script commits a transaction left open first; a plain BEGIN refuses, as it
        # should (a connection cannot be in a transaction here unless something is wrong).
        statement = driver.execute if driver.in_transaction else driver.executescript
        script = "BEGIN IMMEDIATE" if driver.in_transaction else _BEGIN_NOW
        try:
            _done(statement(script), is_async)
        except sqlite3.Error as exc:
            raise _wrapped(exc, "BEGIN IMMEDIATE") from exc

    def sleep(seconds: float) -> None:
        _sleep(seconds, is_async)

    if waiters is not None:
        waiters.step_back(sleep)
    try:
        if _tried(attempt):
            return
        with _waiting(waiters):
            for pause in _pauses():
                sleep(pause)
                if _tried(attempt):
                    return
        raise _locked_too_long("BEGIN IMMEDIATE")
    except BaseException:
        # A refusal stopped the script before its last statement: the busy handler is off
        # still, and reads outside a write transaction want it.
        with contextlib.suppress(Exception):
            _done(driver.execute(BUSY_WAIT), is_async)
        raise


def _done(call: Any, is_async: bool) -> Any:
    """A driver call's result: aiosqlite's, a coroutine, awaited from SQLAlchemy's
    greenlet; sqlite3's as it is."""
    if not is_async:
        return call
    from sqlalchemy.util import await_only

    return await_only(call)


def _tried(attempt: Callable[[], None]) -> bool:
    """Whether ``attempt`` wrote (False: SQLite refused it the lock; other errors raise)."""
    try:
        attempt()
    except Exception as exc:
        if not refused(exc):
            raise
        return False
    return True


def _waiting(waiters: Waiters | None) -> contextlib.AbstractContextManager[None]:
    return waiters.waiting() if waiters is not None else contextlib.nullcontext()


async def retry_refused(write: Callable[[], Awaitable[T]], waiters: Waiters | None = None,
                        ) -> T:
    """Run ``write``, one statement committing by itself on a connection whose busy handler
    is off (:data:`NO_BUSY_WAIT`), again each time SQLite refuses it the write lock (a
    refused statement has written nothing), made known meanwhile as a waiting writer. See
    :func:`_pauses`."""
    try:
        return await write()
    except Exception as exc:
        if not refused(exc):
            raise
        statement = getattr(exc, "statement", None) or ""
    with _waiting(waiters):
        for pause in _pauses():
            await asyncio.sleep(pause)
            try:
                return await write()
            except Exception as exc:
                if not refused(exc):
                    raise
    raise _locked_too_long(statement)


def waiters_of(engine: AsyncEngine) -> Waiters | None:
    """The engine's view of the writers of other processes waiting for its file's lock
    (None for an engine :func:`prepare_sqlite` did not set up)."""
    waiters: Waiters | None = engine.sync_engine.__dict__.get(_WAITERS)
    return waiters


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` (the driver's, or SQLAlchemy's around it) is SQLite refusing the
    write lock, held by another connection."""
    orig = getattr(exc, "orig", None)
    if isinstance(orig, BaseException):
        exc = orig
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) == sqlite3.SQLITE_BUSY
    return "locked" in str(exc)


#: How long a new connection keeps trying to switch a new file to WAL while other
#: connections race to do the same (each try is quick; the backoff between them is short).
_WAL_SWITCH_TIMEOUT = 30.0


def _use_wal(cursor: Any, is_async: bool) -> None:
    """Put the database file in WAL mode, which it then keeps for good.

    Several processes opening a new file at once (workers started together) race to switch
    it, and SQLite answers the losers "database is locked" at once, without waiting on the
    busy timeout. So the mode is read first and switched only if it is not WAL yet, and a
    "locked" answer is retried, re-reading the mode (another process's switch does as well
    as ours), with a short bounded backoff. Under aiosqlite this runs on the event loop's
    thread (in SQLAlchemy's greenlet), so the pause is an ``asyncio.sleep`` there, never a
    blocking one."""
    deadline = time.monotonic() + _WAL_SWITCH_TIMEOUT
    pause = 0.001
    while True:
        try:
            if _journal_mode(cursor, "PRAGMA journal_mode") == "wal":
                return
            if _journal_mode(cursor, "PRAGMA journal_mode=WAL") == "wal":
                return
            problem: Exception | None = None  # not switched (the old mode came back)
        except Exception as exc:  # the driver's OperationalError (sqlite3's, or wrapped)
            if not refused(exc):
                raise
            problem = exc
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError(
                f"could not switch the SQLite database to WAL mode within "
                f"{_WAL_SWITCH_TIMEOUT:.0f} s: {problem or 'the journal mode did not change'}"
            ) from problem
        _sleep(pause * random.uniform(0.5, 1.5), is_async)
        pause = min(pause * 2, 0.1)


def _journal_mode(cursor: Any, statement: str) -> str:
    cursor.execute(statement)
    row = cursor.fetchone()
    return str(row[0]).lower() if row else ""


def _sleep(seconds: float, is_async: bool) -> None:
    if is_async:
        from sqlalchemy.util import await_only

        await_only(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


# The write turn of one async engine's connections, per event loop.
#
# Within a process, waiting on SQLite's busy handler is slow: it sleeps 1, 2, 5, 10 ... ms
# between tries, whereas the writer it waits for usually finishes in well under one. So
# the engine's own writers (publish, acquire, settle in one broker) queue on an asyncio lock
# and start the moment the previous one ends its transaction. Writers of other processes and
# other engines on the same file wait by :func:`_pauses` and :mod:`sqlmq.engines.sqlite.waiters`.
_TURN = "sqlmq_write_turn"
_TURN_TIMEOUT = 60.0


def _take_write_turn(engine: SyncEngine, info: dict[str, Any]) -> None:
    from sqlalchemy.util import await_only

    if _TURN in info:  # this connection holds the turn already (another transaction)
        return
    lock = _turn_lock(engine)
    await_only(_wait_for_turn(lock))
    info[_TURN] = (asyncio.get_running_loop(), lock)


def _turn_lock(engine: SyncEngine) -> asyncio.Lock:
    locks: dict[Any, asyncio.Lock] = engine.__dict__.setdefault(_TURN, {})
    loop = asyncio.get_running_loop()
    lock = locks.get(loop)
    if lock is None:
        lock = locks[loop] = asyncio.Lock()
    return lock


async def _wait_for_turn(lock: asyncio.Lock) -> None:
    try:
        await asyncio.wait_for(lock.acquire(), _TURN_TIMEOUT)
    except TimeoutError:
        raise sqlite3.OperationalError(
            f"database is locked: another transaction of this process held the write lock "
            f"for over {_TURN_TIMEOUT:.0f} s"
        ) from None


@contextlib.asynccontextmanager
async def write_turn(engine: AsyncEngine) -> AsyncIterator[None]:
    """This process's write turn on an SQLite engine, for a statement that commits by
    itself (no BEGIN, so the ``begin`` event does not take the turn for it)."""
    lock = _turn_lock(engine.sync_engine)
    await _wait_for_turn(lock)
    try:
        yield
    finally:
        lock.release()


#: Where a connection keeps the flag its progress handler reads, and how many of SQLite's
#: VM instructions run between two reads: each read takes the GIL, so only statements
#: longer than a few milliseconds make any.
_CUT_SHORT = "sqlmq_cut_short"
_READ_EVERY = 1_000_000


def _let_statements_be_cut_short(record: Any) -> None:
    """A progress handler that aborts the connection's running statement once its flag is
    set. ``sqlite3_interrupt`` would do that too, but its flag stays set until no statement
    of the connection is active: with one stepped and not yet reset (a cursor holding rows
    nobody will read), the ROLLBACK that follows fails as "interrupted" as well. The
    handler's flag is cleared by whoever set it."""
    from sqlalchemy.util import await_only

    flag = record.info[_CUT_SHORT] = [False]
    await_only(record.driver_connection.set_progress_handler(lambda: flag[0], _READ_EVERY))


def _end_transaction_cut_short(_dbapi_conn: Any, record: Any, *_args: Any) -> None:
    """Roll back the transaction of a connection SQLAlchemy is about to throw away.

    A task cancelled inside a statement leaves that statement running on aiosqlite's
    thread; SQLAlchemy then closes the connection, but ``sqlite3_close_v2`` with a statement
    not yet finalized only turns the connection into a zombie that keeps its transaction,
    and so the database's write lock, until the garbage collector frees the cursor: every
    other writer, in any process, waited on the busy timeout meanwhile. So the statement is
    cut short and the transaction rolled back first, on the connection's own thread,
    shielded from a second cancellation. Outside SQLAlchemy's greenlet the rollback runs as
    a task of its own and SQLAlchemy's close may reach the thread first (the statement is
    cut short all the same, and a close rolls back a transaction whose statements are all
    finished); with no event loop (a connection collected as garbage) nothing can run on
    the connection's thread any more."""
    from sqlalchemy.exc import MissingGreenlet
    from sqlalchemy.util import await_only

    driver = getattr(record, "driver_connection", None)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if driver is None:
        return
    cut_short = record.info.get(_CUT_SHORT)
    if cut_short is not None:
        cut_short[0] = True
    rollback = loop.create_task(_roll_back_quietly(driver, cut_short))
    try:
        await_only(asyncio.shield(rollback))
    except MissingGreenlet:
        _ROLLBACKS.add(rollback)
        rollback.add_done_callback(_ROLLBACKS.discard)


_ROLLBACKS: set[asyncio.Task[None]] = set()


async def _roll_back_quietly(driver: Any, cut_short: list[bool] | None) -> None:
    """Roll back once the driver's thread is free, the running statement cut short. The
    ROLLBACK itself is far shorter than the progress handler's period, so the flag, still
    set while it runs, cannot abort it."""
    try:
        # A connection invalidated because it is broken fails; that is no news.
        with contextlib.suppress(Exception):
            await driver.rollback()
    finally:
        if cut_short is not None:
            cut_short[0] = False


def _give_back_write_turn(_dbapi_conn: Any, record: Any, *_args: Any) -> None:
    held = record.info.pop(_TURN, None) if record is not None else None
    if held is None:
        return
    loop, lock = held
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        lock.release()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(lock.release)
