"""One engine per database behind the :class:`Engine` contract (see :mod:`.contract`).

:func:`engine_for` is the only place that chooses an engine: from a URL, or from the
SQLAlchemy engine a caller built. ``memory://`` is the in-process engine of
:mod:`sqlmq.engines.memory.engine`, for tests and examples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import URL
from sqlalchemy.engine import Engine as SyncEngine

from ..connect import parse_url
from ..errors import ConfigurationError
from ..schema import Schema
from .contract import Engine, WakeSource
from .sql.connect import create_async, create_sync
from .sql.drivers import AsyncDriverConnection, DriverConnection, SyncDriverConnection

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from .sql.engine import SqlEngine

#: The URL scheme of the in-memory engine.
MEMORY_SCHEME = "memory"


def is_memory_url(url: str | URL) -> bool:
    """Whether ``url`` names the in-memory engine (``memory://``)."""
    if isinstance(url, URL):
        return url.drivername == MEMORY_SCHEME
    return url.split(":", 1)[0].lower() == MEMORY_SCHEME


def engine_for_url(url: str | URL, schema: Schema) -> Engine:
    """The engine for a database URL; its SQLAlchemy engines are created on first use."""
    if is_memory_url(url):
        from .memory.engine import MemoryEngine

        return MemoryEngine(schema)
    parsed = parse_url(url)
    return _engine_class(parsed.get_backend_name())(None, schema, url=parsed)


def engine_for(target: str | URL | AsyncEngine | SyncEngine, schema: Schema) -> Engine:
    """The engine for ``target``: a URL, or a caller's SQLAlchemy ``AsyncEngine`` (or sync
    ``Engine``, which then serves ``publish_sync`` only)."""
    if isinstance(target, str | URL):
        return engine_for_url(target, schema)
    from sqlalchemy.ext.asyncio import AsyncEngine  # here: the Spark side never needs it

    if isinstance(target, AsyncEngine):
        if target.dialect.name == "sqlite":
            # SQLite needs sqlmq's connection set-up (WAL, BEGIN IMMEDIATE) to share work
            # between processes safely, so sqlmq opens the same file with its own engine.
            return engine_for_url(target.url, schema)
        return _engine_class(target.dialect.name)(target, schema)
    if isinstance(target, SyncEngine):
        return _engine_class(target.dialect.name)(None, schema, sync_db=target)
    raise ConfigurationError(
        f"Broker needs a database URL or a SQLAlchemy engine, got {type(target).__name__}"
    )


def driver_connection_of(connection: object) -> DriverConnection | None:
    """The caller's own connection of a database driver (asyncpg, psycopg, sqlite3,
    aiosqlite, PyMySQL, asyncmy), ready for a publish in its transaction; None for anything
    else. Each database's package knows its drivers (see :mod:`.sql.drivers`)."""
    from .mysql.drivers import DRIVERS as MYSQL
    from .postgresql.drivers import DRIVERS as POSTGRESQL
    from .sqlite.drivers import DRIVERS as SQLITE

    for driver in (*POSTGRESQL, *MYSQL, *SQLITE):
        if driver.recognises(connection):
            return driver(connection)
    return None


def _engine_class(name: str) -> type[SqlEngine]:
    if name == "postgresql":
        from .postgresql.engine import PostgresEngine

        return PostgresEngine
    if name in ("mysql", "mariadb"):
        from .mysql.engine import MysqlEngine

        return MysqlEngine
    if name == "sqlite":
        from .sqlite.engine import SqliteEngine

        return SqliteEngine
    raise ConfigurationError(f"no sqlmq engine for database {name!r}")


__all__ = ["AsyncDriverConnection", "DriverConnection", "Engine", "SyncDriverConnection",
           "WakeSource", "create_async", "create_sync", "driver_connection_of", "engine_for",
           "engine_for_url", "is_memory_url"]
