"""PostgreSQL's INSERT in the caller's transaction (the outbox), on whatever driver the
caller's connection has.

sqlmq writes its statements for asyncpg, with the server's own ``$n`` parameters; the
caller's connection may be SQLAlchemy's over asyncpg, psycopg or psycopg2, or a driver's
own (asyncpg, psycopg: :mod:`..sql.drivers`). The INSERT is the one sqlmq's own publishes
run, with its NOTIFY, which PostgreSQL delivers at the caller's commit (and never on a
rollback): rewritten once per parameter style (:func:`..sql.paramstyles.for_paramstyle`),
after which a call only orders its arguments.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from ...records import NewMessages
from ..sql.drivers import AsyncDriverConnection, SyncDriverConnection
from ..sql.paramstyles import DriverStatement, for_paramstyle
from .copy_publish import insert_args


class CallersInsert:
    """For :class:`~.engine.PostgresEngine`: its INSERT (or INSERT_AT) in the caller's
    transaction."""

    channel: str
    _accept: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The INSERT statements in the style of each caller's driver met.
        self._driver_statements: dict[tuple[str, str], DriverStatement] = {}

    async def _insert_in(self, executor: AsyncConnection | AsyncSession | AsyncDriverConnection,
                         statement: str, messages: NewMessages) -> list[int]:
        if isinstance(executor, AsyncDriverConnection):
            self._accept(executor)
            await executor.begin()
            rows = await executor.run(*self._on_callers_driver(
                statement, executor.PARAMSTYLE, messages))
            return list(rows.rows[0][0])
        if isinstance(executor, AsyncSession):
            executor = await executor.connection()
        result = await executor.exec_driver_sql(*self._on_callers_driver(
            statement, executor.dialect.loaded_dbapi.paramstyle, messages))
        return list(result.scalar_one())

    def _insert_in_sync(self, executor: Connection | Session | SyncDriverConnection,
                        statement: str, messages: NewMessages) -> list[int]:
        if isinstance(executor, SyncDriverConnection):
            self._accept(executor)
            executor.begin()
            return list(executor.run(*self._on_callers_driver(
                statement, executor.PARAMSTYLE, messages)).rows[0][0])
        if isinstance(executor, Session):
            executor = executor.connection()
        result = executor.exec_driver_sql(*self._on_callers_driver(
            statement, executor.dialect.loaded_dbapi.paramstyle, messages))
        return list(result.scalar_one())

    def _on_callers_driver(self, statement: str, paramstyle: str,
                           messages: NewMessages) -> tuple[str, Any]:
        """``statement`` and the arguments of ``messages`` in ``paramstyle``."""
        found = self._driver_statements.get((statement, paramstyle))
        if found is None:
            found = self._driver_statements[statement, paramstyle] = for_paramstyle(
                statement, paramstyle)
        return found.text, found.args(insert_args(self.channel, messages))


__all__ = ["CallersInsert"]
