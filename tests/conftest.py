"""Shared fixtures: every behaviour test runs on PostgreSQL, MariaDB and SQLite, and those
that need only the engine contract on the in-memory engine too (``@on_every_engine``).

Each test gets its own table prefix, so tests never see each other's rows and can run in
parallel (pytest-xdist) against the same databases. Connection URLs come from the
environment (see docs/databases.md), with the local defaults below.
"""

from __future__ import annotations

import asyncio
import copy
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiosqlite
import asyncpg
import pytest
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.exc import OperationalError

from sqlmq import Broker, build_schema
from sqlmq.connect import parse_url, sync_url
from sqlmq.engines import is_memory_url
from sqlmq.engines.memory.engine import MemoryEngine
from sqlmq.engines.mysql import engine as mysql_engine

PG_URL = os.environ.get("SQLMQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("SQLMQ_TEST_MYSQL_URL", "mariadb://root@127.0.0.1:3306/test")

DATABASES = ["sqlite", "postgresql", "mariadb"]
#: The databases and the in-memory engine: where a test that needs only the engine contract
#: (the public API, ``broker.engine``, and :func:`rows`/:func:`update_row`) runs.
EVERY_ENGINE = ["memory", *DATABASES]
#: Runs a test using ``broker``/``db_kind``/``db_url`` on :data:`EVERY_ENGINE` instead.
on_every_engine = pytest.mark.parametrize("db_kind", EVERY_ENGINE)
#: The tests that SIGKILL a relay or an inbox while it moves thousands of messages between a
#: far broker and a database run one after another, on one of the suite's processes
#: (``./dev test`` passes ``--dist loadgroup``): side by side they starved each other and the
#: databases on two cores, and one of them took 299 s of its 300 s limit where it takes 41 s
#: alone.
one_kill_test_at_a_time = pytest.mark.xdist_group("far-broker-kills")


def url_for(kind: str, tmp_path: Any) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/sqlmq-test.db"
    if kind == "postgresql":
        return PG_URL
    return MYSQL_URL


@pytest.fixture(params=DATABASES)
def db_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def db_url(db_kind: str, tmp_path: Any) -> str:
    return url_for(db_kind, tmp_path)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}_"


def _drop(conn: Any, schema: Any) -> None:
    """PostgreSQL and MariaDB drop every table in one statement (drop_all asks about each
    first: 0.05-0.1 s more a test); SQLite drops one table a statement."""
    if conn.dialect.name == "sqlite":
        schema.metadata.drop_all(conn)
        return
    quote = conn.dialect.identifier_preparer.format_table
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {', '.join(quote(t) for t in schema.tables)}")


def drop_tables(url: str, prefix: str, lock_wait: int = 60) -> None:
    """Drop a test's tables; a session still holding locks on them (a leaked transaction)
    fails the test within ``lock_wait`` seconds, naming the sessions where the database
    can list them, instead of hanging the suite."""
    if is_memory_url(url):
        return  # nothing outlives the broker
    sqlite = parse_url(url).get_backend_name() == "sqlite"
    engine = (create_engine(sync_url(parse_url(url)), connect_args={"timeout": lock_wait})
              if sqlite else _dropper(url))
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{lock_wait}s'")
            elif conn.dialect.name in ("mysql", "mariadb"):  # MariaDB's default: a day
                conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {lock_wait}")
            try:
                _drop(conn, build_schema(prefix))
            except OperationalError as exc:
                raise AssertionError(
                    f"dropping the tables of {prefix!r} waited over {lock_wait} s for locks; "
                    f"sessions in a transaction: {_open_transactions(url)}"
                ) from exc
    finally:
        if sqlite:
            engine.dispose()


_droppers: dict[str, SyncEngine] = {}


def _dropper(url: str) -> SyncEngine:
    """One kept connection per server database and test process for the drops: a new one
    per test cost PyMySQL 60-85 ms of CPU (it builds a TLS context for every connection)."""
    engine = _droppers.get(url)
    if engine is None:
        engine = _droppers[url] = create_engine(sync_url(parse_url(url)), pool_size=1,
                                                pool_pre_ping=True)
    return engine


def _open_transactions(url: str) -> list[Any]:
    """The server's sessions in a transaction. SQLite has no server and cannot list the
    connections (of any process) that hold its file's lock: it gets a note saying so."""
    if parse_url(url).get_backend_name() == "sqlite":
        return ["SQLite cannot list them: a connection of this test or of another process "
                "still holds the file's write lock"]
    engine = create_engine(sync_url(parse_url(url)))
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                sql = ("SELECT pid, state, application_name, left(query, 200) FROM "
                       "pg_stat_activity WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()")
            else:
                sql = ("SELECT trx_mysql_thread_id, trx_state, left(trx_query, 200) "
                       "FROM information_schema.innodb_trx")
            return [tuple(r) for r in conn.exec_driver_sql(sql)]
    finally:
        engine.dispose()


@pytest.fixture
async def broker(db_url: str, prefix: str) -> AsyncIterator[Broker]:
    """A migrated broker on its own tables; closed and dropped afterwards."""
    b = Broker(db_url, table_prefix=prefix)
    await b.migrate()
    try:
        yield b
    finally:
        await b.close()
        drop_tables(db_url, prefix)


async def wait_until(
    predicate: Callable[[], Awaitable[bool]] | Callable[[], bool], timeout: float = 20.0,
    interval: float = 0.02, message: str = "condition",
) -> None:
    """Poll until ``predicate`` is true; fail the test with ``message`` after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)


async def drained(broker: Broker, queue: str) -> bool:
    """True when ``queue`` has nothing left in the message table."""
    for s in await broker.stats():
        if s.queue == queue:
            return s.pending + s.processing + s.retryable == 0
    return True


def on_memory(broker: Broker) -> bool:
    return isinstance(broker.engine, MemoryEngine)


def sibling(broker: Broker, url: str, prefix: str, **options: Any) -> Broker:
    """Another broker on ``broker``'s tables, as another process runs one. On the in-memory
    engine the process is the database: the sibling shares ``broker``'s engine."""
    other = Broker(url, table_prefix=prefix, **options)
    if on_memory(broker):
        other._engine = broker.engine
    return other


async def rows(broker: Broker, table: str = "message", **where: Any) -> list[Any]:
    """All rows of the message or archive table (optionally filtered), as mappings; on the
    in-memory engine, snapshots of its rows with the same columns."""
    from sqlalchemy import select

    t = broker.schema.message if table == "message" else broker.schema.archive
    if isinstance(broker.engine, MemoryEngine):
        return memory_rows(broker, table, **where)
    stmt = select(t).where(*(t.c[k] == v for k, v in where.items())).order_by(t.c.id)
    async with broker.db.connect() as conn:
        return [r._mapping for r in await conn.execute(stmt)]


def memory_rows(broker: Broker, table: str = "message", **where: Any) -> list[dict[str, Any]]:
    """:func:`rows` on the in-memory engine (no await needed): snapshots of its rows, with
    the columns of the table."""
    engine = broker.engine
    assert isinstance(engine, MemoryEngine)
    t = broker.schema.message if table == "message" else broker.schema.archive
    with engine._lock:
        store = engine._store.rows if table == "message" else engine._store.archive
        found = [{c.name: copy.deepcopy(getattr(r, c.name)) for c in t.columns
                  if hasattr(r, c.name)} for _, r in sorted(store.items())]
    return [r for r in found if all(r[k] == v for k, v in where.items())]


async def update_row(broker: Broker, msg_id: int, **values: Any) -> None:
    """Set columns of a message row behind sqlmq's back (as a crash or another process
    would leave it): an UPDATE on a database, the row's fields on the in-memory engine."""
    from sqlalchemy import update

    engine = broker.engine
    if isinstance(engine, MemoryEngine):
        with engine._lock:
            row = engine._store.rows[msg_id]
            for name, value in values.items():
                setattr(row, name, value)
            engine._writes += 1  # a commit, as the UPDATE's
        return
    m = broker.schema.message
    async with broker.db.begin() as conn:
        await conn.execute(update(m).where(m.c.id == msg_id).values(**values))


async def passes(broker: Broker, seconds: float) -> None:
    """Let ``seconds`` pass on the broker's clock: at once on the in-memory engine (its clock
    moves), by sleeping on a database."""
    engine = broker.engine
    if isinstance(engine, MemoryEngine):
        engine.advance(seconds)
    else:
        await asyncio.sleep(seconds)


def speed_up(broker: Broker, factor: float = 10.0) -> None:
    """On the in-memory engine, run its clock ``factor`` times faster from now on, so that
    delays and retries fall due sooner; nothing on a database (its clock is the server's)."""
    engine = broker.engine
    if isinstance(engine, MemoryEngine):
        base = engine.clock
        start = base()
        engine.clock = lambda: start + (base() - start) * factor


async def wait_for_count(count: Callable[[], int], target: int, *, stall: float = 20.0,
                         message: str = "progress") -> None:
    """Wait until ``count()`` reaches ``target``, failing only when it stops moving for
    ``stall`` seconds: a long run of steps tests that each step happens, not how fast a
    loaded machine makes them."""
    loop = asyncio.get_running_loop()
    last, since = count(), loop.time()
    while (now_at := count()) < target:
        if now_at != last:
            last, since = now_at, loop.time()
        elif loop.time() - since > stall:
            pytest.fail(f"{message}: stuck at {now_at} of {target} for {stall}s")
        await asyncio.sleep(0.02)


async def archived(broker: Broker, msg_id: int) -> Any:
    """Wait until ``msg_id`` is in the archive and return its row."""
    found: list[Any] = []

    async def check() -> bool:
        found[:] = await rows(broker, "archive", id=msg_id)
        return bool(found)

    await wait_until(check, message=f"message {msg_id} archived")
    return found[0]


class CliResult:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def run_cli(*args: str) -> CliResult:
    """Run ``sqlmq ARGS`` in this process (a fresh interpreter per call costs seconds on a
    loaded machine). Call it from a thread in async tests: it runs its own event loop."""
    import contextlib
    import io

    from sqlmq.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return CliResult(code, out.getvalue(), err.getvalue())


@contextmanager
def counting_inserts(engine: SyncEngine) -> Iterator[list[str]]:
    """The INSERT statements sent meanwhile, through SQLAlchemy on ``engine`` or straight
    to asyncpg as sqlmq's PostgreSQL publish does (the COPY path sends none), or to asyncmy
    as its MariaDB publish does (a packet of statements counts once: one round trip), or to
    aiosqlite's executemany as its SQLite batch publish does."""
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "INSERT" in statement.upper():
            statements.append(statement)

    fetch = asyncpg.Connection.fetch

    async def fetch_recorded(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if "INSERT" in query.upper():
            statements.append(query)
        return await fetch(self, query, *args, **kwargs)

    run = mysql_engine._run

    async def run_recorded(conn: Any, sent: Any, multi: bool) -> Any:
        inserts = [q for q, _ in sent if "INSERT" in q.upper()]
        statements.extend(inserts[:1] if multi else inserts)
        return await run(conn, sent, multi)

    executemany = aiosqlite.Connection.executemany

    async def executemany_recorded(self: Any, sql: str, parameters: Any) -> Any:
        if "INSERT" in sql.upper():
            statements.append(sql)
        return await executemany(self, sql, parameters)

    event.listen(engine, "before_cursor_execute", record)
    asyncpg.Connection.fetch = fetch_recorded  # type: ignore[method-assign]
    aiosqlite.Connection.executemany = executemany_recorded  # type: ignore[method-assign]
    mysql_engine._run = run_recorded  # type: ignore[assignment]
    try:
        yield statements
    finally:
        asyncpg.Connection.fetch = fetch  # type: ignore[method-assign]
        aiosqlite.Connection.executemany = executemany  # type: ignore[method-assign]
        mysql_engine._run = run  # type: ignore[assignment]
        event.remove(engine, "before_cursor_execute", record)


class LoopStalls:
    """The longest this event loop kept a 20 ms ticker waiting past its time while in the
    ``async with``: how long nothing on the loop could run (its process starved of CPU,
    or the loop blocked)."""

    TICK = 0.02

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            at = loop.time() + self.TICK
            await asyncio.sleep(self.TICK)
            self.worst = max(self.worst, loop.time() - at)

    async def __aenter__(self) -> LoopStalls:
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
