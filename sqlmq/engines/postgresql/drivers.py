"""PostgreSQL's drivers as the caller's own connection for the outbox: asyncpg (a
connection, or one of a pool), psycopg's ``AsyncConnection`` and ``Connection`` (see
:mod:`..sql.drivers`).

asyncpg outside ``connection.transaction()`` commits every statement by itself: refused.
psycopg begins a transaction with the first statement unless the connection is in
autocommit mode, where only ``connection.transaction()`` holds one: refused outside it.
Rows are asked for as tuples (psycopg's ``tuple_row``), whatever row factory the caller's
connection has; asyncpg's records are tuples already.
"""

from __future__ import annotations

from typing import Any

from ..sql.drivers import (
    AsyncDriverConnection,
    DriverRows,
    SyncDriverConnection,
    column_names,
)


class _Postgres:
    DATABASE = "postgresql"


class AsyncpgConnection(_Postgres, AsyncDriverConnection):
    NAME = "asyncpg"
    MODULE = "asyncpg"
    CLASSES = ("Connection",)
    SQLALCHEMY_DRIVER = "asyncpg"
    PARAMSTYLE = "numeric_dollar"

    @classmethod
    def recognises(cls, connection: object) -> bool:
        import sys

        pool = sys.modules.get("asyncpg.pool")
        return super().recognises(connection) or (
            pool is not None and isinstance(connection, pool.PoolConnectionProxy))

    async def begin(self) -> None:
        if not self.connection.is_in_transaction():
            raise self.refuse("publish inside `async with connection.transaction():`")

    async def run(self, text: str, args: list[Any]) -> DriverRows:
        records = await self.connection.fetch(text, *args)
        keys = tuple(records[0].keys()) if records else None
        return DriverRows(keys, [tuple(r) for r in records])


def _idle_in_autocommit(connection: Any) -> bool:
    from psycopg.pq import TransactionStatus

    return bool(connection.autocommit
                and connection.info.transaction_status == TransactionStatus.IDLE)


_PSYCOPG_HOW = ("publish inside `with connection.transaction():`, or use a connection "
                "without autocommit")



class PsycopgConnection(_Postgres, SyncDriverConnection):
    NAME = "psycopg"
    MODULE = "psycopg"
    CLASSES = ("Connection",)
    SQLALCHEMY_DRIVER = "psycopg"
    PARAMSTYLE = "format"

    def begin(self) -> None:
        if _idle_in_autocommit(self.connection):
            raise self.refuse(_PSYCOPG_HOW)

    def run(self, text: str, args: list[Any]) -> DriverRows:
        from psycopg.rows import tuple_row

        with self.connection.cursor(row_factory=tuple_row) as cursor:
            cursor.execute(text, args)
            keys = column_names(cursor)
            return DriverRows(keys, cursor.fetchall() if keys is not None else [])


class AsyncPsycopgConnection(_Postgres, AsyncDriverConnection):
    NAME = "psycopg"
    MODULE = "psycopg"
    CLASSES = ("AsyncConnection",)
    SQLALCHEMY_DRIVER = "psycopg"
    PARAMSTYLE = "format"

    async def begin(self) -> None:
        if _idle_in_autocommit(self.connection):
            raise self.refuse(_PSYCOPG_HOW.replace("with connection", "async with connection"))

    async def run(self, text: str, args: list[Any]) -> DriverRows:
        from psycopg.rows import tuple_row

        async with self.connection.cursor(row_factory=tuple_row) as cursor:
            await cursor.execute(text, args)
            keys = column_names(cursor)
            return DriverRows(keys, await cursor.fetchall() if keys is not None else [])


DRIVERS = (AsyncpgConnection, PsycopgConnection, AsyncPsycopgConnection)

__all__ = ["DRIVERS", "AsyncPsycopgConnection", "AsyncpgConnection", "PsycopgConnection"]
