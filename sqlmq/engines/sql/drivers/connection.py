"""The caller's own driver connection (asyncpg, psycopg, sqlite3, aiosqlite, PyMySQL,
asyncmy), as a publish in the caller's transaction runs on it.

Each database's package says how its drivers are recognised, checked and run
(``postgresql/drivers.py``, ``mysql/drivers.py``, ``sqlite/drivers.py``); this module is
what they share. A driver connection is recognised by its class, looked up only in the
modules already imported (a caller holding an asyncpg connection has imported asyncpg):
sqlmq imports no driver to recognise another's connection.

**Its transaction.** The message must commit or roll back with the caller's work, so a
connection that would commit the INSERT by itself is refused before anything is written:
asyncpg outside ``connection.transaction()``, or a connection in autocommit mode outside
a transaction. A connection in the DB-API's usual mode (psycopg, PyMySQL, asyncmy without
autocommit) begins a transaction with its first statement, which the caller then commits or
rolls back, as for any statement of its own. sqlite3 and aiosqlite begin one only before a
write, while a topic or a channel publish reads first: sqlmq begins it (``BEGIN
IMMEDIATE``, as its own SQLite transactions) when the caller has not.

**Its commit.** No driver tells anyone when its transaction commits. Subscribers in this
process learn of the message as those of other processes do: PostgreSQL's NOTIFY and
SQLite's commit counter reach them at the commit; on MySQL and MariaDB, which have neither,
the publish wakes them at once, and their polls, fast after a wake-up, find the message
once the caller commits (:attr:`DriverConnection.COMMIT_WAKES`).
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar

from ....errors import PublishError
from .results import DriverRows


class DriverConnection:
    """A caller's connection of one database driver, for the outbox's statements."""

    #: The driver as its users know it.
    NAME: ClassVar[str]
    #: The module its connection classes are in, and their names there.
    MODULE: ClassVar[str]
    CLASSES: ClassVar[tuple[str, ...]]
    #: The family of databases it speaks to: ``postgresql``, ``mysql`` or ``sqlite``.
    DATABASE: ClassVar[str]
    #: SQLAlchemy's name for the driver: its dialect compiles the statements.
    SQLALCHEMY_DRIVER: ClassVar[str]
    #: The placeholders it is sent (see :mod:`.statements`).
    PARAMSTYLE: ClassVar[str]
    ASYNCHRONOUS: ClassVar[bool]
    #: Whether the database itself wakes subscribers when this connection commits
    #: (PostgreSQL's NOTIFY, SQLite's commit counter); else a publish wakes this process's
    #: subscribers at once (see the module's docstring).
    COMMIT_WAKES: ClassVar[bool] = True

    def __init__(self, connection: Any) -> None:
        #: The caller's connection itself.
        self.connection = connection

    @classmethod
    def recognises(cls, connection: object) -> bool:
        module = sys.modules.get(cls.MODULE)
        if module is None:
            return False
        types = tuple(getattr(module, name) for name in cls.CLASSES if hasattr(module, name))
        return isinstance(connection, types)

    def refuse(self, how: str) -> PublishError:
        """The error of a connection that would commit the message by itself."""
        return PublishError(
            f"the {self.NAME} connection is not in a transaction: the message would commit "
            f"at once, whatever became of the rest of your work; {how}")

    def wrong_database(self, database: str) -> PublishError:
        """The error of a connection to another kind of database than the broker's."""
        return PublishError(
            f"this broker's tables are in {database}, and this {self.NAME} connection speaks "
            f"to {self.DATABASE}: pass a connection to the broker's database (the message "
            "must be in the same transaction as your data)")


class SyncDriverConnection(DriverConnection):
    """A driver that blocks (``publish_sync`` and its twins)."""

    ASYNCHRONOUS = False

    def begin(self) -> None:
        """Refuse a connection that would commit the message by itself (see
        :func:`DriverConnection.refuse`), or begin the transaction it would not have."""
        raise NotImplementedError

    def run(self, text: str, args: list[Any]) -> DriverRows:
        raise NotImplementedError


class AsyncDriverConnection(DriverConnection):
    """An asyncio driver (``await publish(…)`` and its twins)."""

    ASYNCHRONOUS = True

    async def begin(self) -> None:
        """See :meth:`SyncDriverConnection.begin`."""
        raise NotImplementedError

    async def run(self, text: str, args: list[Any]) -> DriverRows:
        raise NotImplementedError


__all__ = ["AsyncDriverConnection", "DriverConnection", "SyncDriverConnection"]
