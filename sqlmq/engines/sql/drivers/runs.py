"""A publish's flow (:mod:`..publish`) on the caller's driver connection.

The flows yield SQLAlchemy Core statements, which run here on the caller's driver instead
of on a SQLAlchemy connection (:mod:`.statements`), in the caller's transaction: the
inserts, the deduplication, a channel's room and a topic's groups are the ones every other
publish of the engine runs.

The statements are compiled for a SQLAlchemy dialect of the caller's very driver, which
knows the server (MariaDB's RETURNING, the casts PostgreSQL's drivers need): sqlmq's own
SQLAlchemy engine when it uses that driver (asyncpg, asyncmy and aiosqlite for ``await
publish``; psycopg, PyMySQL and sqlite3 for ``publish_sync``), else an engine of that driver
made from the broker's URL, which connects once to learn the server and is let go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import URL
from sqlalchemy.engine import Dialect
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.pool import NullPool

from .connection import AsyncDriverConnection, DriverConnection, SyncDriverConnection
from .results import DriverResult
from .statements import prepared

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ..publish import Flow


async def run_driver_flow(conn: AsyncDriverConnection, dialect: Dialect, flow: Flow) -> Any:
    result: Any = None
    try:
        while True:
            statement, params = flow.send(result)
            plan = prepared(statement, dialect, params)
            parts = [await conn.run(text, args) for text, args in plan.calls(params)]
            result = DriverResult(parts, plan.results)
    except StopIteration as done:
        return done.value


def run_driver_flow_sync(conn: SyncDriverConnection, dialect: Dialect, flow: Flow) -> Any:
    result: Any = None
    try:
        while True:
            statement, params = flow.send(result)
            plan = prepared(statement, dialect, params)
            parts = [conn.run(text, args) for text, args in plan.calls(params)]
            result = DriverResult(parts, plan.results)
    except StopIteration as done:
        return done.value


class DriverRuns:
    """For :class:`~..engine.SqlEngine`: the caller's driver connection checked (its
    database, its transaction) and a flow run on it."""

    #: The family of databases of the engine (``postgresql``, ``mysql``, ``sqlite``).
    DATABASE: ClassVar[str]
    url: URL
    db: AsyncEngine
    sync_db: SyncEngine

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: An initialised dialect per driver and kind (sync or async).
        self._driver_dialects: dict[tuple[str, bool], Dialect] = {}

    def _accept(self, conn: DriverConnection) -> None:
        if conn.DATABASE != self.DATABASE:
            raise conn.wrong_database(self.url.get_backend_name())

    async def _on_driver(self, conn: AsyncDriverConnection) -> Dialect:
        """Check ``conn`` (begun if it must be) and the dialect to compile for it."""
        self._accept(conn)
        key = (conn.SQLALCHEMY_DRIVER, True)
        dialect = self._driver_dialects.get(key)
        if dialect is None:
            own = self.db
            engine = own if own.dialect.driver == conn.SQLALCHEMY_DRIVER else None
            if engine is None:
                from sqlalchemy.ext.asyncio import create_async_engine

                engine = create_async_engine(self._url_for(conn), poolclass=NullPool)
            try:
                async with engine.connect():  # the first connection initialises the dialect
                    pass
            finally:
                if engine is not own:
                    await engine.dispose()
            dialect = self._driver_dialects[key] = engine.dialect
        await conn.begin()
        return dialect

    def _on_driver_sync(self, conn: SyncDriverConnection) -> Dialect:
        """The same for a synchronous driver."""
        self._accept(conn)
        key = (conn.SQLALCHEMY_DRIVER, False)
        dialect = self._driver_dialects.get(key)
        if dialect is None:
            from sqlalchemy import create_engine

            own = self.sync_db
            engine = (own if own.dialect.driver == conn.SQLALCHEMY_DRIVER else
                      create_engine(self._url_for(conn), poolclass=NullPool))
            try:
                with engine.connect():
                    pass
            finally:
                if engine is not own:
                    engine.dispose()
            dialect = self._driver_dialects[key] = engine.dialect
        conn.begin()
        return dialect

    def _url_for(self, conn: DriverConnection) -> URL:
        return self.url.set(drivername=f"{self.url.get_backend_name()}+"
                                       f"{conn.SQLALCHEMY_DRIVER}")

    async def _run_on_driver(self, conn: AsyncDriverConnection, make_flow: Any) -> Any:
        dialect = await self._on_driver(conn)
        return await run_driver_flow(conn, dialect, make_flow(dialect))

    def _run_on_driver_sync(self, conn: SyncDriverConnection, make_flow: Any) -> Any:
        dialect = self._on_driver_sync(conn)
        return run_driver_flow_sync(conn, dialect, make_flow(dialect))


__all__ = ["DriverRuns", "run_driver_flow", "run_driver_flow_sync"]
