"""How asyncpg says a connection is gone, for the PostgreSQL engine and the LISTEN
connection (:mod:`sqlmq.engines.postgresql.notify`): a killed backend is an ordinary disconnection,
and asyncpg reports it in several ways, some raised before anything was sent."""

from __future__ import annotations

try:
    import asyncpg
except ImportError:  # pragma: no cover - without sqlmq[postgresql]
    asyncpg = None  # type: ignore[assignment]
from sqlalchemy.exc import DBAPIError


def never_sent(exc: BaseException) -> bool:
    """asyncpg refused to start a statement on a connection it already knew dead: the
    server's goodbye (``terminating connection due to administrator command``) came while the
    connection sat idle, or it is closed. Nothing reached the server."""
    exc = _driver_error(exc)
    if asyncpg is None:
        return False
    text = str(exc)
    return ((isinstance(exc, asyncpg.InternalClientError)
             and text.startswith("cannot switch to state"))
            or (isinstance(exc, asyncpg.InterfaceError) and "connection is closed" in text))


def deadlock_detected(exc: BaseException) -> bool:
    """The server ended the transaction to break a deadlock (SQLSTATE 40P01), whichever
    driver said so (asyncpg's ``sqlstate``, psycopg's ``sqlstate``/``pgcode``)."""
    exc = _driver_error(exc)
    return (getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)) == "40P01"


def connection_lost(exc: BaseException) -> bool:
    """The connection died: a socket error, asyncpg's word for it, or the server's (SQLSTATE
    class 08, or 57P: the server shutting down or ending the session)."""
    exc = _driver_error(exc)
    if isinstance(exc, OSError | TimeoutError):
        return True
    if asyncpg is not None and isinstance(exc, asyncpg.InterfaceError
                                          | asyncpg.InternalClientError
                                          | asyncpg.PostgresConnectionError):
        return True
    return str(getattr(exc, "sqlstate", "") or "").startswith(("08", "57P"))


def _driver_error(exc: BaseException) -> BaseException:
    """The driver's own exception under SQLAlchemy's wrapping (asyncpg's under the
    adapter's, which is its ``__cause__``), or ``exc`` itself."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        return exc.orig.__cause__ or exc.orig
    return exc


def from_driver(exc: BaseException) -> bool:
    return isinstance(exc, OSError | TimeoutError) or (
        asyncpg is not None and isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError
                                           | asyncpg.InternalClientError))
