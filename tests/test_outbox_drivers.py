"""The outbox on the caller's own driver: ``publish(..., connection=...)`` runs in whatever
transaction the application opened, on whatever driver its engine uses, not sqlmq's.

PostgreSQL's statements are written for asyncpg (``$n``); an application's engine is often
``postgresql://`` (psycopg2 in SQLAlchemy) or ``postgresql+psycopg://`` (psycopg 3, sync or
async). Each case publishes a batch and a scheduled message in a transaction it rolls back
(nothing written, no NOTIFY), then in one it commits: the ids returned are the rows', a
running subscriber of the same broker handles them, and on PostgreSQL the NOTIFY the INSERT
carries reaches a LISTEN connection at commit. MariaDB and SQLite run the same steps on
their usual drivers (the engines go through SQLAlchemy Core there).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqlmq import Broker, ConfigurationError, Message
from sqlmq.engines.postgresql.notify import channel_for
from sqlmq.engines.sql.paramstyles import for_paramstyle

from .conftest import drained, drop_tables, rows, url_for, wait_until

# Bodies and headers carry the characters a parameter translation could trip on.
BODIES = ["100% sure", "$1 and %s and %(x)s", "plain"]
HEADERS = {"h": "50% é $2 ?"}
LATE = "scheduled in the past: %% $6"


def _case(database: str, driver: str, asynchronous: bool, session: bool) -> Any:
    kind = "session" if session else "connection"
    return pytest.param(database, driver, asynchronous, session,
                        id=f"{database}-{driver}-{'async' if asynchronous else 'sync'}-{kind}")


CASES = [
    *(_case("postgresql", driver, asynchronous, session)
      for driver, asynchronous in [("asyncpg", True), ("psycopg", True), ("psycopg", False),
                                   ("psycopg2", False)]
      for session in (False, True)),
    _case("mariadb", "pymysql", False, False),
    _case("mariadb", "asyncmy", True, False),
    _case("sqlite", "pysqlite", False, False),
    _case("sqlite", "aiosqlite", True, False),
]


async def _publish_all(broker: Broker, executor: Any) -> list[int]:
    ids = await broker.publish_batch("q", BODIES, headers=HEADERS, connection=executor)
    past = datetime.now(UTC) - timedelta(seconds=1)
    return [*ids, await broker.publish("q", LATE, at=past, connection=executor)]


def _publish_all_sync(broker: Broker, executor: Any) -> list[int]:
    ids = broker.publish_batch_sync("q", BODIES, headers=HEADERS, connection=executor)
    past = datetime.now(UTC) - timedelta(seconds=1)
    return [*ids, broker.publish_sync("q", LATE, at=past, connection=executor)]


async def _in_transaction(broker: Broker, engine: AsyncEngine, session: bool,
                          commit: bool) -> list[int]:
    """Publish in a transaction of the caller's async engine, then end it."""
    executor: AsyncSession | Any
    async with AsyncSession(engine) if session else engine.connect() as executor:
        await executor.begin()
        ids = await _publish_all(broker, executor)
        await (executor.commit() if commit else executor.rollback())
    return ids


def _in_transaction_sync(broker: Broker, engine: SyncEngine, session: bool,
                         commit: bool) -> list[int]:
    """The same on the caller's sync engine (run on a thread: the subscriber keeps going)."""
    with Session(engine) if session else engine.connect() as executor:
        executor.begin()
        ids = _publish_all_sync(broker, executor)
        executor.commit() if commit else executor.rollback()
    return ids


@pytest.mark.parametrize(("database", "driver", "asynchronous", "session"), CASES)
async def test_outbox_publish_on_the_callers_driver(
    database: str, driver: str, asynchronous: bool, session: bool, tmp_path: Any,
    prefix: str,
) -> None:
    url = url_for(database, tmp_path)
    parsed = make_url(url)
    users_url = parsed.set(drivername=f"{parsed.get_backend_name()}+{driver}")
    sqlite = database == "sqlite"
    options: dict[str, Any] = {"connect_args": {"timeout": 60}} if sqlite else {}
    engine: Any = (create_async_engine if asynchronous else create_engine)(users_url,
                                                                            **options)
    broker = Broker(url, table_prefix=prefix)
    listener: asyncpg.Connection | None = None
    try:
        await broker.migrate()
        notified: list[str] = []
        if database == "postgresql":
            listener = await asyncpg.connect(url)
            await listener.add_listener(channel_for(broker.schema),
                                        lambda *args: notified.append(args[3]))
        handled: dict[int, Any] = {}

        @broker.subscriber("q", workers=1, flush_interval=0.01, max_fetch_interval=0.05)
        async def handle(msg: Message) -> None:
            handled[msg.id] = (msg.body, msg.headers.get("h"))

        await broker.start()

        async def publish(commit: bool) -> list[int]:
            if asynchronous:
                return await _in_transaction(broker, engine, session, commit)
            return await asyncio.to_thread(_in_transaction_sync, broker, engine, session,
                                           commit)

        rolled_back = await publish(commit=False)
        assert len(rolled_back) == len(BODIES) + 1
        assert await rows(broker) == [] and await rows(broker, "archive") == []

        ids = await publish(commit=True)

        assert len(ids) == len(BODIES) + 1 and len(set(ids)) == len(ids)
        assert ids[:-1] == sorted(ids[:-1])  # a batch's ids come in body order
        await wait_until(lambda: len(handled) >= len(ids), message="the committed messages")
        await wait_until(lambda: drained(broker, "q"), message="the queue drained")
        archived = {r["id"]: r["payload"] for r in await rows(broker, "archive")}
        assert archived == {i: b.encode() for i, b in zip(ids, [*BODIES, LATE], strict=True)}
        assert handled == {i: (b, HEADERS["h"] if b != LATE else None)
                           for i, b in zip(ids, [*BODIES, LATE], strict=True)}
        if listener is not None:
            # Notifications arrive in commit order, identical ones of a transaction folded
            # into one: a NOTIFY of the rolled-back publish would have come first.
            await wait_until(lambda: bool(notified), message="the commit's NOTIFY")
            assert notified == ["q"]
    finally:
        if listener is not None:
            await listener.close()
        await broker.close()
        if asynchronous:
            await engine.dispose()
        else:
            engine.dispose()
        drop_tables(url, prefix)


# ---- the rewrite itself (no database) -------------------------------------------------------


def test_rewrite_to_format_reorders_repeats_and_escapes() -> None:
    statement = for_paramstyle(
        "SELECT $2, '$1 100%', \"c$1\", $$ $1 $$, $f$ $1 $f$, E'\\' $1', $1 -- $3\n, $1 % 2, a$1",
        "format")

    assert statement.text == (
        "SELECT %s, '$1 100%%', \"c$1\", $$ $1 $$, $f$ $1 $f$, E'\\' $1', %s -- $3\n"
        ", %s %% 2, a$1")
    assert statement.args(["one", "two"]) == ("two", "one", "one")


@pytest.mark.parametrize(("paramstyle", "text", "args"), [
    ("numeric_dollar", "SELECT $2, $1, $2", ["a", "b"]),
    ("pyformat", "SELECT %s, %s, %s", ("b", "a", "b")),
    ("qmark", "SELECT ?, ?, ?", ("b", "a", "b")),
    ("numeric", "SELECT :2, :1, :2", ["a", "b"]),
    ("named", "SELECT :p2, :p1, :p2", {"p1": "a", "p2": "b"}),
])
def test_rewrite_for_each_paramstyle(paramstyle: str, text: str, args: Any) -> None:
    statement = for_paramstyle("SELECT $2, $1, $2", paramstyle)

    assert (statement.text, statement.args(["a", "b"])) == (text, args)


def test_the_insert_statements_take_every_argument() -> None:
    """INSERT and INSERT_AT, as the outbox runs them on a ``%s`` driver: every argument
    used (a column the statements gain is a new ``$n``, picked up by the rewrite)."""
    from sqlmq.engines.postgresql import statements as postgresql

    for text in (postgresql.INSERT, postgresql.INSERT_AT):
        statement = for_paramstyle(text, "pyformat")
        assert "$" not in statement.text.replace("$$", "")
        assert statement.order is not None
        assert set(statement.order) == set(range(max(statement.order) + 1))


def test_an_unknown_paramstyle_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="paramstyle"):
        for_paramstyle("SELECT $1", "percent")
