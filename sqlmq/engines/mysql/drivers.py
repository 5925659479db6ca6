"""MySQL's and MariaDB's drivers as the caller's own connection for the outbox: PyMySQL and
asyncmy (see :mod:`..sql.drivers`).

Without autocommit (both drivers' default) the first statement begins a transaction, which
the caller commits or rolls back; in autocommit mode a connection is refused unless the
server says a transaction is open (``connection.begin()``). Rows are asked for as tuples
(the drivers' plain ``Cursor``), whatever cursor class the caller's connection has. MySQL
tells no one of a commit, so a publish wakes this process's subscribers at once
(:attr:`~..sql.drivers.DriverConnection.COMMIT_WAKES`).
"""

from __future__ import annotations

from typing import Any

from ..sql.drivers import (
    AsyncDriverConnection,
    DriverRows,
    SyncDriverConnection,
    column_names,
)

#: The server's status flag of an open transaction (``SERVER_STATUS_IN_TRANS``).
_IN_TRANSACTION = 1
_HOW = "call connection.begin() first, or use a connection without autocommit"


class _Mysql:
    DATABASE = "mysql"
    COMMIT_WAKES = False
    PARAMSTYLE = "format"



class PyMysqlConnection(_Mysql, SyncDriverConnection):
    NAME = "PyMySQL"
    MODULE = "pymysql.connections"
    CLASSES = ("Connection",)
    SQLALCHEMY_DRIVER = "pymysql"

    def begin(self) -> None:
        c = self.connection
        if c.get_autocommit() and not c.server_status & _IN_TRANSACTION:
            raise self.refuse(_HOW)

    def run(self, text: str, args: list[Any]) -> DriverRows:
        from pymysql.cursors import Cursor

        with self.connection.cursor(Cursor) as cursor:
            cursor.execute(text, args)
            return DriverRows(column_names(cursor), list(cursor.fetchall()), cursor.lastrowid)


class AsyncmyConnection(_Mysql, AsyncDriverConnection):
    NAME = "asyncmy"
    MODULE = "asyncmy.connection"
    CLASSES = ("Connection",)
    SQLALCHEMY_DRIVER = "asyncmy"

    async def begin(self) -> None:
        c = self.connection
        if c.get_autocommit() and not c.get_transaction_status():
            raise self.refuse(_HOW.replace("call connection", "await connection"))

    async def run(self, text: str, args: list[Any]) -> DriverRows:
        from asyncmy.cursors import Cursor

        async with self.connection.cursor(Cursor) as cursor:
            await cursor.execute(text, args)
            rows = await cursor.fetchall()
            return DriverRows(column_names(cursor), list(rows or ()), cursor.lastrowid)


DRIVERS = (PyMysqlConnection, AsyncmyConnection)

__all__ = ["DRIVERS", "AsyncmyConnection", "PyMysqlConnection"]
