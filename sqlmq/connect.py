"""From a URL to SQLAlchemy engines (async for the runtime, sync for ``publish_sync``).

Users write ``postgresql://``, ``mysql://``/``mariadb://`` or ``sqlite:///path``; sqlmq picks
the drivers. Passwords never leave this module in clear: :func:`safe_url` is what logs,
errors and the CLI show.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import URL, event, make_url
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .errors import ConfigurationError

# backend -> (async driver, sync driver)
_DRIVERS = {
    "postgresql": ("asyncpg", "psycopg"),
    "mysql": ("asyncmy", "pymysql"),
    "mariadb": ("asyncmy", "pymysql"),
    "sqlite": ("aiosqlite", "pysqlite"),
}
_ALIASES = {"postgres": "postgresql"}
_MODULES = {"pysqlite": "sqlite3"}

#: Execution option marking a connection that only reads (SQLite then skips the write lock).
READ_ONLY = "sqlmq_read_only"


def parse_url(url: str | URL) -> URL:
    """Validate a database URL and return it with sqlmq's async driver."""
    if isinstance(url, str):
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError):  # ValueError: a port that is not a number
            raise ConfigurationError(
                f"cannot parse database URL {_mask_text(url)!r}: expected postgresql://..., "
                "mysql://..., mariadb://... or sqlite:///path"
            ) from None
    else:
        parsed = url
    backend = _ALIASES.get(parsed.get_backend_name(), parsed.get_backend_name())
    if backend not in _DRIVERS:
        raise ConfigurationError(
            f"unsupported database {backend!r} in {safe_url(parsed)}: sqlmq supports "
            "postgresql://, mysql://, mariadb:// and sqlite:///path"
        )
    if backend == "sqlite" and (not parsed.database or parsed.database == ":memory:"):
        raise ConfigurationError(
            "sqlite needs a file path (sqlite:///path/to/file.db): an in-memory database is "
            "private to one connection, so workers and publishers would not share it"
        )
    driver = _DRIVERS[backend][0]
    _require(driver)
    return parsed.set(drivername=f"{backend}+{driver}")


def sync_url(url: URL) -> URL:
    backend = _ALIASES.get(url.get_backend_name(), url.get_backend_name())
    driver = _DRIVERS[backend][1]
    _require(driver)
    return url.set(drivername=f"{backend}+{driver}")


def _require(driver: str) -> None:
    module = _MODULES.get(driver, driver)
    if importlib.util.find_spec(module) is None:
        raise ConfigurationError(
            f"database driver {driver!r} is not installed: pip install {driver}"
        )


def safe_url(url: str | URL | AsyncEngine | SyncEngine) -> str:
    """The URL with its password replaced by ``***``."""
    if isinstance(url, AsyncEngine | SyncEngine):
        url = url.url
    if isinstance(url, str):
        try:
            url = make_url(url)
        except (ArgumentError, ValueError):
            return _mask_text(url)
    return url.render_as_string(hide_password=True)


def _mask_text(url: str) -> str:
    # An unparseable URL may still carry user:password@; cut it out.
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


def _engine_options(url: URL) -> dict[str, Any]:
    backend = url.get_backend_name()
    if backend == "sqlite":
        return {"connect_args": {"timeout": 60}}
    opts: dict[str, Any] = {"pool_pre_ping": True, "pool_size": 10, "max_overflow": 20}
    if backend in ("mysql", "mariadb"):
        opts["isolation_level"] = "READ COMMITTED"
        opts["pool_recycle"] = 3600
    return opts


def create_async(url: URL) -> AsyncEngine:
    if url.get_backend_name() in ("mysql", "mariadb") and "charset" not in url.query:
        url = url.update_query_dict({"charset": "utf8mb4"})
    options = _engine_options(url)
    if url.get_backend_name() == "postgresql" and "application_name" in url.query:
        # asyncpg rejects it as a connect() keyword; it is a server setting there.
        name = url.query["application_name"]
        options["connect_args"] = {"server_settings": {"application_name": str(name)}}
        url = url.difference_update_query(["application_name"])
    engine = create_async_engine(url, **options)
    if url.get_backend_name() == "sqlite":
        prepare_sqlite(engine.sync_engine)
    return engine


def create_sync(url: URL) -> SyncEngine:
    from sqlalchemy import create_engine

    if url.get_backend_name() in ("mysql", "mariadb") and "charset" not in url.query:
        url = url.update_query_dict({"charset": "utf8mb4"})
    engine = create_engine(url, **_engine_options(url))
    if url.get_backend_name() == "sqlite":
        prepare_sqlite(engine)
    return engine


def prepare_sqlite(engine: SyncEngine) -> None:
    """WAL, a long busy timeout, and ``BEGIN IMMEDIATE`` for every transaction.

    The driver's own deferred BEGIN would let two processes both read a message as ready
    and then race to upgrade their locks; taking the write lock up front makes acquire
    exclusive instead.
    """

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # Reads (stats, reports) need no write lock: with one they would queue behind every
        # open writer, a caller's outbox transaction included.
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
            return
        if engine.dialect.is_async:
            _take_write_turn(engine, conn.connection.info)
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    if engine.dialect.is_async:
        @event.listens_for(engine, "commit")
        @event.listens_for(engine, "rollback")
        def _end(conn: Any) -> None:
            # These fire just before the driver's COMMIT/ROLLBACK; the next writer is let in
            # once this task yields, i.e. while that statement runs on the driver's thread.
            held = conn.connection.info.pop(_TURN, None)
            if held is not None:
                held[0].call_soon(held[1].release)

        for name in ("checkin", "close", "invalidate"):
            event.listen(engine, name, _give_back_write_turn)


# The write turn of one async engine's connections, per event loop.
#
# Within a process, waiting on SQLite's busy handler is slow: it sleeps 1, 2, 5, 10 ... ms
# between tries, whereas the writer it waits for usually finishes in well under one. So
# the engine's own writers (publish, acquire, settle in one broker) queue on an asyncio lock
# and start the moment the previous one ends its transaction. The busy timeout still
# governs other processes and other engines on the same file.
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
