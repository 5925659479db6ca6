"""The outbox on a driver's own connection: ``publish(…, connection=conn)`` where ``conn``
is the caller's asyncpg (alone or a pool's), psycopg (async and sync), PyMySQL, asyncmy,
sqlite3 or aiosqlite connection, each on the database it speaks to.

Every case publishes what a publish can be (a batch with headers, a message scheduled in
the past, a deduplicated one, one in a channel, a topic's copy) beside a write of the
caller's own, rolls the transaction back (nothing of either is left), then does it again
and commits: the ids are the rows', a running subscriber handles them all. Then: a
connection to the wrong kind of database, or one that would commit the message by itself,
is refused before anything is written; a refused publish (a full channel) fails alone,
the caller's transaction going on; a batch of thousands keeps its order; on PostgreSQL the
commit's NOTIFY wakes a running subscriber.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import Column, Float, Integer, MetaData, Table, create_engine, func, select

from sqlmq import Broker, ChannelFull, Message, PublishError
from sqlmq.connect import parse_url, sync_url
from sqlmq.engines.postgresql.notify import channel_for

from .conftest import drained, drop_tables, rows, url_for, wait_until
from .driver_connections import DRIVERS, driver_connection

# What a driver's parameter handling could trip on: every placeholder style's characters.
BODIES = ["100% sure", "$1 and %s and %(x)s and ? and :p", "plain"]
HEADERS = {"h": "50% é $2 ?"}
LATE = "scheduled in the past"


def _cases(drivers: list[tuple[str, str]] = DRIVERS) -> list[Any]:
    return [pytest.param(database, driver, id=driver) for database, driver in drivers]


def _orders(prefix: str) -> Table:
    """A table of the caller's own, written in the same transaction as the messages."""
    return Table(f"{prefix}order", MetaData(), Column("id", Integer, primary_key=True),
                 Column("total", Float, nullable=False))


class Setup:
    """A migrated broker on ``database`` with the caller's orders table; torn down after."""

    def __init__(self, database: str, tmp_path: Any, prefix: str) -> None:
        self.url = url_for(database, tmp_path)
        self.prefix = prefix
        self.broker = Broker(self.url, table_prefix=prefix)
        self.orders = _orders(prefix)
        self._sync = create_engine(sync_url(parse_url(self.url)))

    async def __aenter__(self) -> Setup:
        await self.broker.migrate()
        self.orders.metadata.create_all(self._sync)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.broker.close()
        self.orders.metadata.drop_all(self._sync)
        self._sync.dispose()
        drop_tables(self.url, self.prefix)

    def order_count(self) -> int:
        with self._sync.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(self.orders)).scalar_one())


async def _publish_everything(s: Setup, conn: Any) -> dict[int, tuple[str, str]]:
    """A write of the caller's and every kind of publish, in ``conn``'s transaction; the
    messages' ids, with their queue and body."""
    await conn.execute(f"INSERT INTO {s.orders.name} (total) VALUES (12.5)")
    b = s.broker
    batch = await conn.publish(b, "publish_batch", "q", BODIES, headers=HEADERS)
    assert len(batch) == len(BODIES) and batch == sorted(batch)  # in body order
    past = datetime.now(UTC) - timedelta(seconds=1)
    late = await conn.publish(b, "publish", "q", LATE, at=past)
    keyed = await conn.publish(b, "publish", "q", "keyed", dedup_key="k")
    again = await conn.publish(b, "publish", "q", "keyed again", dedup_key="k")
    assert (again, again.duplicate, keyed.duplicate) == (keyed, True, False)
    channelled = await conn.publish(b, "publish", "q", "in a channel", channel="tenant-1")
    fanout = await conn.publish(b, "publish_topic", "orders.created", "a copy")
    assert list(fanout) == ["billing@orders.*"]
    published = {i: ("q", body) for i, body in zip(batch, BODIES, strict=True)}
    published.update({late: ("q", LATE), keyed: ("q", "keyed"), channelled: ("q", "in a channel"),
                      fanout["billing@orders.*"]: ("billing@orders.*", "a copy")})
    assert len(published) == len(BODIES) + 4  # ids all different
    return published


@pytest.mark.parametrize(("database", "driver"), _cases())
async def test_a_publish_on_the_callers_driver_commits_or_rolls_back_with_its_transaction(
    database: str, driver: str, tmp_path: Any, prefix: str,
) -> None:
    async with Setup(database, tmp_path, prefix) as s:
        broker = s.broker
        await broker.join_group("orders.*", "billing")
        handled: dict[int, tuple[str, Any, str | None]] = {}

        @broker.subscriber(["q", "billing@orders.*"], workers=2, flush_interval=0.01,
                           max_fetch_interval=0.1)
        async def handle(msg: Message) -> None:
            handled[msg.id] = (msg.queue, msg.body, msg.headers.get("h"))

        await broker.start()
        async with driver_connection(driver, s.url) as conn:
            await conn.begin()
            await _publish_everything(s, conn)
            await conn.rollback()
            assert await rows(broker) == [] and s.order_count() == 0

            await conn.begin()
            published = await _publish_everything(s, conn)
            await conn.commit()

        assert s.order_count() == 1
        await wait_until(lambda: len(handled) >= len(published), message="the messages")
        await wait_until(lambda: drained(broker, "q"), message="the queue drained")
        assert handled == {i: (queue, body, HEADERS["h"] if body in BODIES else None)
                           for i, (queue, body) in published.items()}
        archived = {r["id"]: (r["queue"], r["payload"], r["channel"])
                    for r in await rows(broker, "archive")}
        assert archived == {i: (queue, body.encode(), "tenant-1" if "channel" in body else None)
                            for i, (queue, body) in published.items()}


@pytest.mark.parametrize(("database", "driver"), _cases())
async def test_a_batch_of_thousands_on_the_callers_driver_keeps_its_order(
    database: str, driver: str, tmp_path: Any, prefix: str,
) -> None:
    """More rows than one multi-row INSERT takes (CHUNK): a plain batch's ids in body
    order, every row stored with its body (a keyed batch's inserts go in key order)."""
    bodies = [f"m{i}" for i in range(2_345)]
    async with Setup(database, tmp_path, prefix) as s, \
            driver_connection(driver, s.url) as conn:
        await conn.begin()
        ids = await conn.publish(s.broker, "publish_batch", "q", bodies, headers=HEADERS)
        keyed = await conn.publish(s.broker, "publish_batch", "q", bodies[:1_500],
                                   dedup_keys=bodies[:1_500])
        await conn.commit()
        assert len(ids) == len(set(ids)) == len(bodies) and ids == sorted(ids)
        assert len(set(keyed)) == len(keyed) and not any(k.duplicate for k in keyed)
        stored = {r["id"]: r["payload"].decode() for r in await rows(s.broker)}
        assert [stored[i] for i in ids] == bodies
        assert [stored[i] for i in keyed] == bodies[:1_500]


@pytest.mark.parametrize(("database", "driver"), _cases())
async def test_a_refused_publish_on_the_callers_driver_fails_alone(
    database: str, driver: str, tmp_path: Any, prefix: str,
) -> None:
    """A full channel refuses a publish with ChannelFull and writes nothing of it; the
    caller's transaction goes on and commits the rest."""
    async with Setup(database, tmp_path, prefix) as s:
        await s.broker.set_channel("tenant-1", max_size=1)
        async with driver_connection(driver, s.url) as conn:
            await conn.begin()
            first = await conn.publish(s.broker, "publish", "q", "fits", channel="tenant-1")
            with pytest.raises(ChannelFull):
                await conn.publish(s.broker, "publish", "q", "too many", channel="tenant-1")
            with pytest.raises(PublishError, match="priority"):
                await conn.publish(s.broker, "publish", "q", "bad", priority=10**6)
            await conn.execute(f"INSERT INTO {s.orders.name} (total) VALUES (1.0)")
            await conn.commit()
        assert [(r["id"], r["payload"]) for r in await rows(s.broker)] == [(first, b"fits")]
        assert s.order_count() == 1


# ---- refusals --------------------------------------------------------------------------------

#: A connection that would commit each statement by itself, per driver.
AUTOCOMMIT: dict[str, dict[str, Any]] = {
    "psycopg-async": {"autocommit": True}, "psycopg": {"autocommit": True},
    "pymysql": {"autocommit": True}, "asyncmy": {"autocommit": True},
    "sqlite3": {"isolation_level": None}, "aiosqlite": {"isolation_level": None},
    "asyncpg": {}, "asyncpg-pool": {},
}


@pytest.mark.parametrize(("database", "driver"), _cases())
async def test_a_connection_outside_a_transaction_that_would_commit_alone_is_refused(
    database: str, driver: str, tmp_path: Any, prefix: str,
) -> None:
    async with Setup(database, tmp_path, prefix) as s:
        await s.broker.join_group("orders.*", "billing")
        async with driver_connection(driver, s.url, **AUTOCOMMIT[driver]) as conn:
            for method, args in [("publish", ("q", "x")), ("publish_batch", ("q", ["x", "y"])),
                                 ("publish_topic", ("orders.created", "x"))]:
                with pytest.raises(PublishError, match=f"the {_named(driver)} connection is "
                                                       "not in a transaction"):
                    await conn.publish(s.broker, method, *args)
        assert await rows(s.broker) == []


def _named(driver: str) -> str:
    return {"pymysql": "PyMySQL"}.get(driver, driver.split("-")[0])


@pytest.mark.parametrize(("database", "driver"), _cases([
    ("postgresql", "psycopg"), ("postgresql", "psycopg-async"), ("mariadb", "pymysql"),
    ("mariadb", "asyncmy"), ("sqlite", "sqlite3"), ("sqlite", "aiosqlite")]))
async def test_an_autocommit_connection_inside_a_transaction_publishes_in_it(
    database: str, driver: str, tmp_path: Any, prefix: str,
) -> None:
    """Autocommit is refused only outside a transaction: inside one the message is the
    transaction's, and a rollback takes it back."""
    async with Setup(database, tmp_path, prefix) as s, \
            driver_connection(driver, s.url, **AUTOCOMMIT[driver]) as conn:
        for end in ("rollback", "commit"):
            await conn.execute("BEGIN IMMEDIATE" if database == "sqlite" else "BEGIN")
            msg_id = await conn.publish(s.broker, "publish", "q", end)
            await (conn.commit() if end == "commit" else conn.rollback())
        assert [(r["id"], r["payload"]) for r in await rows(s.broker)] == [(msg_id, b"commit")]


def test_sqlite3_outside_a_transaction_gets_one_that_the_caller_ends(
    tmp_path: Any, prefix: str,
) -> None:
    """In sqlite3's default mode sqlmq begins the transaction (a topic publish reads
    first, which the module would run outside one): the caller's rollback takes it back."""
    import asyncio
    import sqlite3

    async def main() -> None:
        async with Setup("sqlite", tmp_path, prefix) as s:
            await s.broker.join_group("orders.*", "billing")
            conn = sqlite3.connect(parse_url(s.url).database, timeout=60)
            try:
                s.broker.publish_topic_sync("orders.created", "x", connection=conn)
                assert conn.in_transaction
                conn.rollback()
                assert await rows(s.broker) == []
                with conn:  # commits
                    s.broker.publish_topic_sync("orders.created", "y", connection=conn)
                assert [r["payload"] for r in await rows(s.broker)] == [b"y"]
            finally:
                conn.close()

    asyncio.run(main())


#: A connection of each driver to another kind of database than the broker's.
ELSEWHERE = [("sqlite", "asyncpg"), ("mariadb", "psycopg-async"), ("sqlite", "psycopg"),
             ("postgresql", "pymysql"), ("sqlite", "asyncmy"), ("postgresql", "sqlite3"),
             ("mariadb", "aiosqlite")]
DRIVER_DATABASE = {driver: database for database, driver in DRIVERS}


@pytest.mark.parametrize(("database", "driver"),
                         [pytest.param(db, d, id=f"{d}-to-{db}") for db, d in ELSEWHERE])
async def test_a_connection_to_another_kind_of_database_is_refused(
    database: str, driver: str, tmp_path: Any, prefix: str,
) -> None:
    connection_url = url_for(DRIVER_DATABASE[driver], tmp_path)
    async with Setup(database, tmp_path, prefix) as s, \
            driver_connection(driver, connection_url) as conn:
        await conn.begin()
        spoken = DRIVER_DATABASE[driver].replace("mariadb", "mysql")
        backend = parse_url(s.url).get_backend_name()
        for method, args in [("publish", ("q", "x")), ("publish_batch", ("q", ["x", "y"])),
                             ("publish", ("q", "x")), ("publish_topic", ("orders.created", "x"))]:
            with pytest.raises(PublishError, match=f"tables are in {backend}, and this "
                                                   f"{_named(driver)} connection speaks to "
                                                   f"{spoken}"):
                await conn.publish(s.broker, method, *args)
        await conn.rollback()
        assert await rows(s.broker) == []


async def test_a_sync_driver_in_an_async_publish_is_refused_and_named() -> None:
    import sqlite3

    broker = Broker("memory://")
    conn = sqlite3.connect(":memory:")
    try:
        with pytest.raises(PublishError, match="publish_sync"):
            await broker.publish("q", "x", connection=conn)
        with pytest.raises(PublishError, match=r"connection= takes .* got builtins\.dict"):
            await broker.publish("q", "x", connection={})  # type: ignore[arg-type]
    finally:
        conn.close()
        await broker.close()


@pytest.mark.parametrize("driver", ["asyncpg", "sqlite3"])
async def test_the_memory_engine_refuses_a_drivers_connection(driver: str, tmp_path: Any,
                                                              ) -> None:
    """memory:// follows a transaction through SQLAlchemy's events, which a driver's own
    connection has none of: it says so instead of publishing at once."""
    broker = Broker("memory://")
    try:
        async with driver_connection(driver, url_for(DRIVER_DATABASE[driver], tmp_path)) as conn:
            await conn.begin()
            with pytest.raises(PublishError, match="memory:// cannot follow the transaction"):
                await conn.publish(broker, "publish", "q", "x")
            await conn.rollback()
        assert [s for s in await broker.stats() if s.pending] == []
    finally:
        await broker.close()


# ---- wake-ups --------------------------------------------------------------------------------


def _watched(broker: Broker) -> tuple[list[str], list[int]]:
    """The queues this process's subscribers are woken for (from now on, before the
    broker starts), and the ids a subscriber of queue ``q`` handles."""
    woken: list[str] = []
    handled: list[int] = []
    wake = broker._wakeups.wake
    broker._wakeups.wake = lambda queue: (woken.append(queue), wake(queue))  # type: ignore[method-assign]

    @broker.subscriber("q", workers=1, flush_interval=0.01)
    async def handle(msg: Message) -> None:
        handled.append(msg.id)

    return woken, handled


@pytest.mark.parametrize(("database", "driver"), _cases(
    [("postgresql", "asyncpg"), ("postgresql", "psycopg-async"), ("postgresql", "psycopg")]))
async def test_the_commit_of_a_drivers_transaction_notifies_a_running_subscriber(
    database: str, driver: str, tmp_path: Any, prefix: str,
) -> None:
    """The INSERT's NOTIFY is delivered at the commit, never for a rolled-back publish:
    this process's subscriber is woken by it (the publish itself wakes no one: the driver
    tells no one of its commit), and a LISTEN connection elsewhere receives it once."""
    async with Setup(database, tmp_path, prefix) as s:
        broker = s.broker
        woken, handled = _watched(broker)
        notified: list[str] = []
        listener = await asyncpg.connect(s.url)
        await listener.add_listener(channel_for(broker.schema),
                                    lambda *args: notified.append(args[3]))
        try:
            await broker.start()
            async with driver_connection(driver, s.url) as conn:
                await conn.begin()
                await conn.publish(s.broker, "publish", "q", "rolled back")
                await conn.rollback()
                await conn.begin()
                msg_id = await conn.publish(s.broker, "publish", "q", "committed")
                assert woken == []  # not visible yet: nothing to wake anyone for
                await conn.commit()
            await wait_until(lambda: handled == [msg_id], message="the committed message")
            assert "q" in woken
            # Notifications come in commit order: the rolled-back publish's would be first.
            await wait_until(lambda: bool(notified), message="the commit's NOTIFY")
            assert notified == ["q"]
        finally:
            await listener.close()


@pytest.mark.parametrize(("database", "driver"), _cases(
    [("mariadb", "pymysql"), ("mariadb", "asyncmy")]))
async def test_on_mariadb_a_drivers_publish_wakes_subscribers_at_once(
    database: str, driver: str, tmp_path: Any, prefix: str,
) -> None:
    """MariaDB tells no one of a commit: the publish wakes this process's subscribers, whose
    polls, fast after a wake-up, find the message once the caller commits."""
    async with Setup(database, tmp_path, prefix) as s:
        broker = s.broker
        woken, handled = _watched(broker)
        await broker.start()
        async with driver_connection(driver, s.url) as conn:
            await conn.begin()
            msg_id = await conn.publish(s.broker, "publish", "q", "x")
            assert woken == ["q"]
            await conn.commit()
        await wait_until(lambda: handled == [msg_id], message="the committed message")


# ---- statements as each driver is sent them (no database) ------------------------------------


def _dialect(url: str) -> Any:
    from sqlalchemy.ext.asyncio import create_async_engine

    return (create_async_engine if "async" in url else create_engine)(url).dialect


@pytest.mark.parametrize(("url", "placeholders"), [
    ("postgresql+asyncpg://h/d", ["$1", "$2", "$3", "$4", "$5", "$6"]),
    ("postgresql+psycopg://h/d", ["%s"] * 6),
    ("mariadb+pymysql://h/d", ["%s"] * 6),
    ("mariadb+asyncmy://h/d", ["%s"] * 6),
    ("sqlite+pysqlite:///f", ["?"] * 6),
])
def test_many_rows_go_as_one_insert_numbered_in_the_drivers_style(
    url: str, placeholders: list[str],
) -> None:
    import re

    from sqlmq.engines.sql.drivers.statements import prepared

    table = Table("t", MetaData(), Column("id", Integer, primary_key=True),
                  Column("a", Integer), Column("b", Float))
    statement = table.insert().returning(table.c.id)
    rows = [{"a": 1, "b": 0.5}, {"a": 2, "b": 1.5}, {"a": 3, "b": 2.5}]

    ((text, args),) = list(prepared(statement, _dialect(url), rows).calls(rows))

    assert re.findall(r"\$\d+|%s|\?", text) == placeholders
    assert text.count("), (") == 2 and "RETURNING" in text and args == [1, 0.5, 2, 1.5, 3, 2.5]


def test_placeholders_in_literals_and_percent_signs_stay_as_the_driver_reads_them() -> None:
    from sqlalchemy import literal_column, text

    from sqlmq.engines.sql.drivers.statements import prepared

    statement = text("SELECT '?', '100%', :a, '$1', :b").bindparams(a=1, b=2)
    for url, expected in [
        ("sqlite+pysqlite:///f", "SELECT '?', '100%', ?, '$1', ?"),
        ("postgresql+asyncpg://h/d", "SELECT '?', '100%', $1::INTEGER, '$1', $2::INTEGER"),
        ("postgresql+psycopg://h/d", "SELECT '?', '100%%', %s::INTEGER, '$1', %s::INTEGER"),
        ("mariadb+pymysql://h/d", "SELECT '?', '100%%', %s, '$1', %s"),
    ]:
        ((sql, args),) = list(prepared(statement, _dialect(url), None).calls(None))
        assert (sql, args) == (expected, [1, 2]), url
    # an INSERT with a parameter after its VALUES group goes a row at a time
    table = Table("t", MetaData(), Column("id", Integer, primary_key=True), Column("a", Integer))
    upsert = table.insert().values(a=literal_column(":a")).returning(table.c.id)
    rows = [{"a": 1}, {"a": 2}]
    calls = list(prepared(upsert, _dialect("sqlite+pysqlite:///f"), rows).calls(rows))
    assert len(calls) == 2
