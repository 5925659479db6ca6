"""SQLite's drivers as the caller's own connection for the outbox: sqlite3 and aiosqlite
(see :mod:`..sql.drivers`).

In the sqlite3 module's default mode a transaction begins only before a write (``INSERT``,
``UPDATE``, …), and a topic's or a channel's publish reads first: when the caller's
connection is not in a transaction, sqlmq begins one as its own engine does, ``BEGIN
IMMEDIATE`` (``BEGIN EXCLUSIVE`` if that is the connection's ``isolation_level``), a write
transaction from its first statement, which cannot fail later for a write another
connection made meanwhile. The caller commits it (``with connection:``, ``commit()``) or
rolls it back. A connection in autocommit mode (``isolation_level=None``, or Python 3.12's
``autocommit=True``) outside a transaction would commit each statement: refused. Rows are
asked for as tuples, whatever the connection's ``row_factory``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..sql.drivers import (
    AsyncDriverConnection,
    DriverRows,
    SyncDriverConnection,
    column_names,
)

_HOW = ('execute("BEGIN") first, or use a connection that is not in autocommit mode '
        "(isolation_level=None)")


class _Sqlite:
    DATABASE = "sqlite"
    PARAMSTYLE = "qmark"


def _begin_statement(connection: Any, in_transaction: bool, refuse: Any) -> str | None:
    """The BEGIN sqlmq sends on ``connection`` (a sqlite3 connection's), None for none."""
    if in_transaction:
        return None
    # Python 3.12's; -1: the legacy mode, where isolation_level=None is autocommit
    autocommit = getattr(connection, "autocommit", -1)
    if autocommit is True or (autocommit == -1 and connection.isolation_level is None):
        raise refuse(_HOW)
    exclusive = (connection.isolation_level or "").upper() == "EXCLUSIVE"
    return "BEGIN EXCLUSIVE" if exclusive else "BEGIN IMMEDIATE"


class _Attributes:
    """An aiosqlite connection's ``isolation_level``, and its sqlite3 connection's
    ``autocommit`` where there is one (Python 3.12)."""

    def __init__(self, connection: Any) -> None:
        self.isolation_level = connection.isolation_level
        raw = getattr(connection, "_conn", None)
        if raw is not None and hasattr(type(raw), "autocommit"):
            with contextlib.suppress(Exception):  # a read from another thread, refused
                self.autocommit = raw.autocommit



class Sqlite3Connection(_Sqlite, SyncDriverConnection):
    NAME = "sqlite3"
    MODULE = "sqlite3"
    CLASSES = ("Connection",)
    SQLALCHEMY_DRIVER = "pysqlite"

    def begin(self) -> None:
        c = self.connection
        statement = _begin_statement(c, c.in_transaction, self.refuse)
        if statement is not None:
            c.execute(statement)

    def run(self, text: str, args: list[Any]) -> DriverRows:
        cursor = self.connection.cursor()
        try:
            cursor.row_factory = None
            cursor.execute(text, args)
            return DriverRows(column_names(cursor), cursor.fetchall(), cursor.lastrowid)
        finally:
            cursor.close()


class AiosqliteConnection(_Sqlite, AsyncDriverConnection):
    NAME = "aiosqlite"
    MODULE = "aiosqlite"
    CLASSES = ("Connection",)
    SQLALCHEMY_DRIVER = "aiosqlite"

    async def begin(self) -> None:
        c = self.connection
        # aiosqlite passes isolation_level on; Python 3.12's autocommit is its sqlite3's
        statement = _begin_statement(_Attributes(c), c.in_transaction, self.refuse)
        if statement is not None:
            await (await c.execute(statement)).close()

    async def run(self, text: str, args: list[Any]) -> DriverRows:
        cursor = await self.connection.execute(text, args)
        try:
            cursor.row_factory = None
            rows = await cursor.fetchall()
            return DriverRows(column_names(cursor), list(rows), cursor.lastrowid)
        finally:
            await cursor.close()


DRIVERS = (Sqlite3Connection, AiosqliteConnection)

__all__ = ["DRIVERS", "AiosqliteConnection", "Sqlite3Connection"]
