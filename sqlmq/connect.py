"""From a URL to SQLAlchemy engines (async for the runtime, sync for ``publish_sync``).

Users write ``postgresql://``, ``mysql://``/``mariadb://`` or ``sqlite:///path``; sqlmq picks
the drivers. Passwords never leave this module in clear: :func:`safe_url` is what logs,
errors and the CLI show.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import re
import shlex
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlencode

from sqlalchemy import URL, event, make_url
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.exc import ArgumentError

from .errors import ConfigurationError, ConnectTimeout

if TYPE_CHECKING:  # imported where used: the Spark workers need none of the asyncio side
    from sqlalchemy.ext.asyncio import AsyncEngine

# backend -> (async driver, sync driver)
_DRIVERS = {
    "postgresql": ("asyncpg", "psycopg"),
    "mysql": ("asyncmy", "pymysql"),
    "mariadb": ("asyncmy", "pymysql"),
    "sqlite": ("aiosqlite", "pysqlite"),
}
_ALIASES = {"postgres": "postgresql"}
_MODULES = {"pysqlite": "sqlite3"}

#: Execution option marking a connection that only reads (SQLite then skips the write lock).
READ_ONLY = "sqlmq_read_only"


def parse_url(url: str | URL) -> URL:
    """Validate a database URL and return it with sqlmq's async driver."""
    if isinstance(url, str):
        parsed = _parse_text(url)
    else:
        parsed = url
    backend = _ALIASES.get(parsed.get_backend_name(), parsed.get_backend_name())
    if backend not in _DRIVERS:
        raise ConfigurationError(
            f"unsupported database {backend!r} in {safe_url(parsed)}: sqlmq supports "
            "postgresql://, mysql://, mariadb:// and sqlite:///path"
        )
    if backend == "sqlite" and (not parsed.database or parsed.database == ":memory:"):
        raise ConfigurationError(
            "sqlite needs a file path (sqlite:///path/to/file.db): an in-memory database is "
            "private to one connection, so workers and publishers would not share it"
        )
    driver = _DRIVERS[backend][0]
    _require(driver)
    return parsed.set(drivername=f"{backend}+{driver}")


def _parse_text(url: str) -> URL:
    try:
        return _split_userinfo(url) or make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigurationError(
            f"cannot parse database URL {_mask_text(url)!r}: expected postgresql://..., "
            "mysql://..., mariadb://... or sqlite:///path"
        ) from None


def _split_userinfo(url: str) -> URL | None:
    """``user:p@ss@host``: an unencoded ``@`` in the password. SQLAlchemy splits at the
    first ``@`` (host ``ss@host``, and a log line showing half the password); the host is
    what follows the last one, as a person reading the URL means."""
    scheme, sep, rest = url.partition("://")
    authority = rest.split("?", 1)[0]
    if not sep or authority.count("@") < 2:
        return None
    at = authority.rindex("@")
    userinfo, hostpart = rest[:at], rest[at + 1 :]
    user, _, password = userinfo.partition(":")
    parsed = make_url(f"{scheme}://{hostpart}")
    return parsed.set(username=unquote(user) or None, password=unquote(password) or None)


def sync_url(url: URL) -> URL:
    """The same database with sqlmq's synchronous driver (``publish_sync``, Spark)."""
    backend = _ALIASES.get(url.get_backend_name(), url.get_backend_name())
    driver = _DRIVERS[backend][1]
    _require(driver)
    return url.set(drivername=f"{backend}+{driver}")


# driver -> the sqlmq extra that installs it (SQLite's drivers come with sqlmq itself)
_EXTRAS = {"asyncpg": "postgresql", "psycopg": "postgresql", "asyncmy": "mysql",
           "pymysql": "mysql"}


def _require(driver: str) -> None:
    module = _MODULES.get(driver, driver)
    if importlib.util.find_spec(module) is None:
        extra = _EXTRAS.get(driver)
        hint = f"pip install 'sqlmq[{extra}]'" if extra else f"pip install {driver}"
        raise ConfigurationError(
            f"database driver {driver!r} is not installed: {hint}"
        )


# Query parameters that carry a secret, whatever the driver.
_SECRET_PARAMS = ("password", "passwd", "sslpassword", "secret", "token")


def safe_url(url: str | URL | AsyncEngine | SyncEngine) -> str:
    """The URL with its password replaced by ``***``, in the user info and in the query
    (``?password=``); the one form of a URL that logs, errors and the CLI show."""
    if not isinstance(url, str | URL):  # an AsyncEngine or a SyncEngine
        url = url.url
    if isinstance(url, str):
        try:
            url = _split_userinfo(url) or make_url(url)
        except (ArgumentError, ValueError):
            return _mask_text(url)
    secret = {key: "***" for key in url.query
              if any(word in key.lower() for word in _SECRET_PARAMS)}
    if secret:
        url = url.update_query_dict(secret)
    return url.render_as_string(hide_password=True).replace("=%2A%2A%2A", "=***")


def _mask_text(url: str) -> str:
    # An unparseable URL may still carry user:password@ or ?password=; cut them out.
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        url = f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return re.sub(r"((?:pass|secret|token)[^=&]*=)[^&]*", r"\1***", url, flags=re.IGNORECASE)


def _engine_options(url: URL) -> dict[str, Any]:
    backend = url.get_backend_name()
    if backend == "sqlite":
        return {"connect_args": {"timeout": 60}}
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


def prepare_sqlite(engine: SyncEngine) -> None:
    """WAL, a long busy timeout, and ``BEGIN IMMEDIATE`` for every transaction.

    The driver's own deferred BEGIN would let two processes both read a message as ready
    and then race to upgrade their locks; taking the write lock up front makes acquire
    exclusive instead.
    """

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        _use_wal(cursor, engine.dialect.is_async)
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # Reads (stats, reports) need no write lock: with one they would queue behind every
        # open writer, a caller's outbox transaction included.
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
            return
        if engine.dialect.is_async:
            _take_write_turn(engine, conn.connection.info)
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    if engine.dialect.is_async:
        @event.listens_for(engine, "commit")
        @event.listens_for(engine, "rollback")
        def _end(conn: Any) -> None:
            # These fire just before the driver's COMMIT/ROLLBACK; the next writer is let in
            # once this task yields, i.e. while that statement runs on the driver's thread.
            if conn.invalidated:
                # A task cancelled inside a statement: SQLAlchemy invalidated the connection,
                # and reading it here would raise, turning the cancellation into a
                # PendingRollbackError. The pool's invalidate event gives the turn back.
                return
            held = conn.connection.info.pop(_TURN, None)
            if held is not None:
                held[0].call_soon(held[1].release)

        # Before the turn is given back: the next writer would wait on the lock otherwise.
        event.listen(engine, "invalidate", _end_transaction_cut_short)
        for name in ("checkin", "close", "invalidate"):
            event.listen(engine, name, _give_back_write_turn)


#: How long a new connection keeps trying to switch a new file to WAL while other
#: connections race to do the same (each try is quick; the backoff between them is short).
_WAL_SWITCH_TIMEOUT = 30.0


def _use_wal(cursor: Any, is_async: bool) -> None:
    """Put the database file in WAL mode, which it then keeps for good.

    Several processes opening a new file at once (workers started together) race to switch
    it, and SQLite answers the losers "database is locked" at once, without waiting on the
    busy timeout. So the mode is read first and switched only if it is not WAL yet, and a
    "locked" answer is retried, re-reading the mode (another process's switch does as well
    as ours), with a short bounded backoff. Under aiosqlite this runs on the event loop's
    thread (in SQLAlchemy's greenlet), so the pause is an ``asyncio.sleep`` there, never a
    blocking one."""
    import random
    import time

    deadline = time.monotonic() + _WAL_SWITCH_TIMEOUT
    pause = 0.001
    while True:
        try:
            if _journal_mode(cursor, "PRAGMA journal_mode") == "wal":
                return
            if _journal_mode(cursor, "PRAGMA journal_mode=WAL") == "wal":
                return
            problem: Exception | None = None  # not switched (the old mode came back)
        except Exception as exc:  # the driver's OperationalError (sqlite3's, or wrapped)
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            problem = exc
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError(
                f"could not switch the SQLite database to WAL mode within "
                f"{_WAL_SWITCH_TIMEOUT:.0f} s: {problem or 'the journal mode did not change'}"
            ) from problem
        _sleep(pause * random.uniform(0.5, 1.5), is_async)
        pause = min(pause * 2, 0.1)


def _journal_mode(cursor: Any, statement: str) -> str:
    cursor.execute(statement)
    row = cursor.fetchone()
    return str(row[0]).lower() if row else ""


def _sleep(seconds: float, is_async: bool) -> None:
    if is_async:
        from sqlalchemy.util import await_only

        await_only(asyncio.sleep(seconds))
    else:
        import time

        time.sleep(seconds)


# The write turn of one async engine's connections, per event loop.
#
# Within a process, waiting on SQLite's busy handler is slow: it sleeps 1, 2, 5, 10 ... ms
# between tries, whereas the writer it waits for usually finishes in well under one. So
# the engine's own writers (publish, acquire, settle in one broker) queue on an asyncio lock
# and start the moment the previous one ends its transaction. The busy timeout still
# governs other processes and other engines on the same file.
_TURN = "sqlmq_write_turn"
_TURN_TIMEOUT = 60.0


def _take_write_turn(engine: SyncEngine, info: dict[str, Any]) -> None:
    from sqlalchemy.util import await_only

    if _TURN in info:  # this connection holds the turn already (another transaction)
        return
    lock = _turn_lock(engine)
    await_only(_wait_for_turn(lock))
    info[_TURN] = (asyncio.get_running_loop(), lock)


def _turn_lock(engine: SyncEngine) -> asyncio.Lock:
    locks: dict[Any, asyncio.Lock] = engine.__dict__.setdefault(_TURN, {})
    loop = asyncio.get_running_loop()
    lock = locks.get(loop)
    if lock is None:
        lock = locks[loop] = asyncio.Lock()
    return lock


async def _wait_for_turn(lock: asyncio.Lock) -> None:
    try:
        await asyncio.wait_for(lock.acquire(), _TURN_TIMEOUT)
    except TimeoutError:
        raise sqlite3.OperationalError(
            f"database is locked: another transaction of this process held the write lock "
            f"for over {_TURN_TIMEOUT:.0f} s"
        ) from None


@contextlib.asynccontextmanager
async def write_turn(engine: AsyncEngine) -> AsyncIterator[None]:
    """This process's write turn on an SQLite engine, for a statement that commits by
    itself (no BEGIN, so the ``begin`` event does not take the turn for it)."""
    lock = _turn_lock(engine.sync_engine)
    await _wait_for_turn(lock)
    try:
        yield
    finally:
        lock.release()


def _end_transaction_cut_short(_dbapi_conn: Any, record: Any, *_args: Any) -> None:
    """Roll back the transaction of a connection SQLAlchemy is about to throw away.

    A task cancelled inside a statement leaves that statement running on aiosqlite's
    thread; SQLAlchemy then closes the connection, but ``sqlite3_close_v2`` with a statement
    not yet finalized only turns the connection into a zombie that keeps its transaction,
    and so the database's write lock, until the garbage collector frees the cursor: every
    other writer, in any process, waited on the busy timeout meanwhile. So the statement is
    interrupted and the transaction rolled back first, on the connection's own thread,
    shielded from a second cancellation. Outside SQLAlchemy's greenlet the rollback runs as
    a task of its own; with no event loop (a connection collected as garbage) nothing can
    run on the connection's thread any more."""
    from sqlalchemy.exc import MissingGreenlet
    from sqlalchemy.util import await_only

    driver = getattr(record, "driver_connection", None)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if driver is None:
        return
    rollback = loop.create_task(_roll_back_quietly(driver))
    try:
        await_only(asyncio.shield(rollback))
    except MissingGreenlet:
        _ROLLBACKS.add(rollback)
        rollback.add_done_callback(_ROLLBACKS.discard)


_ROLLBACKS: set[asyncio.Task[None]] = set()


async def _roll_back_quietly(driver: Any) -> None:
    # A connection invalidated because it is broken fails both; that is no news.
    with contextlib.suppress(Exception):
        await driver.interrupt()
    with contextlib.suppress(Exception):
        await driver.rollback()


def _give_back_write_turn(_dbapi_conn: Any, record: Any, *_args: Any) -> None:
    held = record.info.pop(_TURN, None) if record is not None else None
    if held is None:
        return
    loop, lock = held
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        lock.release()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(lock.release)
