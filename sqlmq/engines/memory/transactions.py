"""The caller's transaction, as the in-memory engine follows it: a publish with
``connection=`` takes effect at its commit (SQLAlchemy's events tell it)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from ...errors import PublishError
from ..sql.drivers import DriverConnection


async def begin_callers(executor: Any) -> None:
    """Begin the caller's AsyncConnection if it is not in a transaction, as an INSERT on it
    would: the begin may need the event loop, which the synchronous half cannot use."""
    if isinstance(executor, AsyncConnection) and not executor.in_transaction():
        await executor.begin()


def transaction_owner(executor: Any) -> Connection | Session:
    """The sync object whose events tell the commit, in a transaction by now: a row
    inserted on a connection outside one would begin one (SQLAlchemy's autobegin), and a
    commit of a connection that never began sends no event."""
    if isinstance(executor, AsyncSession):
        return executor.sync_session
    if isinstance(executor, AsyncConnection):
        executor = executor.sync_connection
        if executor is None:
            raise PublishError("the AsyncConnection given to publish() is not started")
    if isinstance(executor, Connection):
        if not executor.in_transaction():
            executor.begin()
        return executor
    if isinstance(executor, Session):
        return executor
    if isinstance(executor, DriverConnection):
        raise PublishError(
            f"memory:// cannot follow the transaction of a {executor.NAME} connection: it "
            "learns of a commit or a rollback from SQLAlchemy's events, which a driver's own "
            "connection has none of; in tests on memory:// pass a SQLAlchemy Connection or "
            "Session, or run them on the database itself")
    raise PublishError(f"publish() takes a Connection, AsyncConnection, Session or "
                       f"AsyncSession, got {type(executor).__name__}")


__all__ = ["begin_callers", "transaction_owner"]
