"""From a URL to SQLAlchemy engines for each database: the drivers' arguments (libpq's
parameters for asyncpg, bounded handshakes for asyncmy and PyMySQL), the pools, and SQLite's
connection set-up (:mod:`..sqlite.connections`). Async for the runtime, sync for
``publish_sync`` and Spark.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from sqlalchemy import URL, event
from sqlalchemy.engine import Engine as SyncEngine

from ...connect import safe_url
from ...errors import ConfigurationError, ConnectTimeout
from ..sqlite.connections import prepare_sqlite

if TYPE_CHECKING:  # imported where used: the Spark workers need none of the asyncio side
    from sqlalchemy.ext.asyncio import AsyncEngine


def _engine_options(url: URL) -> dict[str, Any]:
    backend = url.get_backend_name()
    if backend == "sqlite":
        # The pool's rollback of every connection it takes back is prepare_sqlite's instead,
        # made only for one left in a transaction (..sqlite.connections._roll_back_if_open).
        return {"connect_args": {"timeout": 60}, "pool_reset_on_return": None}
    opts: dict[str, Any] = {"pool_pre_ping": True, "pool_size": 10, "max_overflow": 20}
    if backend in ("mysql", "mariadb"):
        opts["isolation_level"] = "READ COMMITTED"
        opts["pool_recycle"] = 3600
    return opts


#: Seconds a connection attempt may take, handshake included, unless the URL sets
#: ``connect_timeout``: a server that accepts TCP and never answers must not hang a worker.
DEFAULT_CONNECT_TIMEOUT = 10

# libpq's TLS parameters; asyncpg reads them from a DSN, not as connect() keywords.
_LIBPQ_SSL = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl",
              "sslnegotiation", "ssl_min_protocol_version", "ssl_max_protocol_version")
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def create_async(url: URL) -> AsyncEngine:
    from sqlalchemy.ext.asyncio import create_async_engine

    shown = safe_url(url)
    url = _with_charset(url)
    options = _engine_options(url)
    if url.get_backend_name() == "postgresql":
        url, connect_args = _asyncpg_args(url, shown)
        options["connect_args"] = connect_args
    elif url.get_backend_name() in ("mysql", "mariadb"):
        options["connect_args"] = _asyncmy_args(url, shown)
    engine = create_async_engine(url, **options)
    if url.get_backend_name() == "sqlite":
        prepare_sqlite(engine.sync_engine)
    return engine


def _with_charset(url: URL) -> URL:
    if url.get_backend_name() in ("mysql", "mariadb") and "charset" not in url.query:
        return url.update_query_dict({"charset": "utf8mb4"})
    return url


def _asyncpg_args(url: URL, shown: str) -> tuple[URL, dict[str, Any]]:
    """Translate the libpq parameters every PostgreSQL user writes (``sslmode``,
    ``connect_timeout``, ``options``, ``application_name``) into asyncpg's arguments:
    passed through, asyncpg rejects them as unknown ``connect()`` keywords."""
    import asyncpg

    query = {key: _one(value) for key, value in url.query.items()}
    # sqlmq's statements are short; JIT compiling one whose estimate runs high (the fair
    # acquire's per-row channel lookup) took 40 ms to save nothing. ``options=-c jit=on``
    # in the URL turns it back on.
    settings: dict[str, str] = {"jit": "off"}
    if "options" in query:
        settings.update(_server_options(query.pop("options")))
    if "application_name" in query:
        settings["application_name"] = query.pop("application_name")
    timeout = _timeout(query.pop("connect_timeout", None))
    ssl = {key: query.pop(key) for key in _LIBPQ_SSL if key in query}
    if "sslmode" in ssl and ssl["sslmode"] not in _SSLMODES:
        raise ConfigurationError(
            f"sslmode={ssl['sslmode']!r} in {shown}: expected one of {', '.join(_SSLMODES)}"
        )
    args: dict[str, Any] = {
        "timeout": timeout,
        "async_creator_fn": _bounded(asyncpg.connect, "timeout", shown),
    }
    args["server_settings"] = settings
    if ssl:  # host, port, user and database still come from the keywords, which win
        args["dsn"] = "postgresql://?" + urlencode(ssl)
    return url.set(query=query), args


def _asyncmy_args(url: URL, shown: str) -> dict[str, Any]:
    """asyncmy's own ``connect_timeout`` covers opening the socket only; the handshake
    would wait for ever, so the whole connect is bounded by the same number."""
    import asyncmy

    args: dict[str, Any] = {"async_creator_fn": _bounded(asyncmy.connect, "connect_timeout",
                                                         shown)}
    if "connect_timeout" not in url.query:
        args["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT
    return args


def _one(value: str | tuple[str, ...]) -> str:
    return value[-1] if isinstance(value, tuple) else value


def _timeout(value: str | None) -> float:
    if value is None:
        return float(DEFAULT_CONNECT_TIMEOUT)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ConfigurationError(f"connect_timeout must be a positive number of seconds, "
                                 f"got {value!r}")
    return seconds


def _server_options(options: str) -> dict[str, str]:
    """libpq's ``options`` (``-c name=value`` or ``--name=value``, repeated) as server
    settings."""
    settings: dict[str, str] = {}
    words = shlex.split(options)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-c" and i + 1 < len(words):
            word, i = words[i + 1], i + 1
        elif word.startswith("-c"):
            word = word[2:]
        elif word.startswith("--"):
            word = word[2:]
        else:
            word = ""
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise ConfigurationError(
                f"cannot read options={options!r}: expected '-c name=value' settings"
            )
        settings[name.replace("-", "_")] = value
        i += 1
    return settings


#: Connection attempts whose caller was cancelled, left to finish (see :func:`_bounded`).
_abandoned: set[asyncio.Future[Any]] = set()


def _bounded(connect: Callable[..., Any], timeout_keyword: str,
             shown: str) -> Callable[..., Awaitable[Any]]:
    """``connect`` with the whole attempt bounded, failing with a message that says what
    happened (asyncpg's own timeout raises a bare ``TimeoutError``).

    A caller cancelled meanwhile (a stopping subscriber, a caller's own timeout) does not
    cancel the attempt: it runs on and the connection it makes is closed. asyncpg cancelled
    while its socket opens closes it before the SSL answer, and the future that waited for
    that answer then holds an error no one reads: asyncio logs "Future exception was never
    retrieved ... unexpected connection_lost() call" as an error, with no cause to show.
    """

    async def connect_within(*args: Any, **kwargs: Any) -> Any:
        timeout = float(kwargs.get(timeout_keyword) or DEFAULT_CONNECT_TIMEOUT)
        attempt = asyncio.ensure_future(connect(*args, **kwargs))
        try:
            return await asyncio.wait_for(asyncio.shield(attempt), timeout)
        except TimeoutError:
            # No answer: the attempt waits for the server's reply, where cancelling is clean.
            attempt.cancel()
            _abandon(attempt)
            raise _connect_timeout(shown, timeout) from None
        except asyncio.CancelledError:
            _abandon(attempt)
            raise

    return connect_within


def _abandon(attempt: asyncio.Future[Any]) -> None:
    _abandoned.add(attempt)
    attempt.add_done_callback(_close_abandoned)


async def finish_abandoned(within: float = DEFAULT_CONNECT_TIMEOUT) -> None:
    """Wait (at most ``within`` seconds) for this event loop's abandoned connection attempts.

    A broker closing calls this, so a connect it left running is closed by then instead of
    being cancelled when the loop ends: cancelled while its socket opens, asyncpg leaves
    the future of the SSL answer holding an error no one reads, and asyncio logs it as an
    error whenever the garbage collector gets to it, in whatever test or task runs then.
    """
    loop = asyncio.get_running_loop()
    mine = [a for a in _abandoned if a.get_loop() is loop]
    if mine:
        await asyncio.wait(mine, timeout=within)


def _close_abandoned(attempt: asyncio.Future[Any]) -> None:
    _abandoned.discard(attempt)
    if attempt.cancelled() or attempt.exception() is not None:
        return  # the caller has gone; its error would tell no one anything
    conn = attempt.result()
    with contextlib.suppress(Exception):
        (getattr(conn, "terminate", None) or conn.close)()


def _connect_timeout(shown: str, timeout: float) -> ConnectTimeout:
    return ConnectTimeout(
        f"no answer from the database server at {shown} within {timeout:g} s "
        f"(connect_timeout): the server accepted the connection but did not complete the "
        f"handshake; is this the right host and port, and is the server overloaded?"
    )


def create_sync(url: URL) -> SyncEngine:
    from sqlalchemy import create_engine

    shown = safe_url(url)
    url = _with_charset(url)
    if url.get_backend_name() == "postgresql" and "connect_timeout" not in url.query:
        url = url.update_query_dict({"connect_timeout": str(DEFAULT_CONNECT_TIMEOUT)})
    engine = create_engine(url, **_engine_options(url))
    if url.get_backend_name() in ("mysql", "mariadb"):
        _bound_pymysql_handshake(engine, shown)
    if url.get_backend_name() == "sqlite":
        prepare_sqlite(engine)
    return engine


def _bound_pymysql_handshake(engine: SyncEngine, shown: str) -> None:
    """PyMySQL applies ``connect_timeout`` to opening the socket only and then reads the
    server's greeting with no timeout: connect with a read timeout, then lift it."""

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        if "read_timeout" in cparams:  # the user's own: it bounds the handshake already
            return None
        timeout = cparams.setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        try:
            conn = dialect.loaded_dbapi.connect(*cargs, read_timeout=timeout, **cparams)
        except dialect.loaded_dbapi.OperationalError as exc:
            if "timed out" in str(exc):
                raise _connect_timeout(shown, timeout) from None
            raise
        conn._read_timeout = None  # PyMySQL applies it before each read
        return conn
