"""Schema creation, versions, and the refusal to run on a missing or old schema."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import Index, MetaData, Table, delete, func, inspect, select

from sqlmq import SCHEMA_VERSION, Broker, Message, SchemaError
from sqlmq.channels import TURN_QUANTUM
from sqlmq.lifecycle import Outcome
from sqlmq.records import Delivery, NewMessages, Settlement

from .conftest import drop_tables, rows


async def test_starting_on_a_missing_schema_says_to_run_migrate(db_url: str, prefix: str) -> None:
    broker = Broker(db_url, table_prefix=prefix)

    @broker.subscriber("q")
    async def handle(msg: Message) -> None: ...

    try:
        with pytest.raises(SchemaError, match="sqlmq migrate"):
            await broker.start()
    finally:
        await broker.close()


async def test_concurrent_migrations_create_the_schema_once(db_url: str, prefix: str) -> None:
    brokers = [Broker(db_url, table_prefix=prefix) for _ in range(4)]
    try:
        versions = await asyncio.gather(*(b.migrate() for b in brokers))
        assert versions == [SCHEMA_VERSION] * 4
        async with brokers[0].db.connect() as conn:
            tables = await conn.run_sync(lambda c: inspect(c).get_table_names())
            recorded = (await conn.execute(
                select(func.count()).select_from(brokers[0].schema.version))).scalar_one()
        assert {f"{prefix}message", f"{prefix}archive", f"{prefix}schema"} <= set(tables)
        assert recorded == SCHEMA_VERSION
    finally:
        for b in brokers:
            await b.close()
        drop_tables(db_url, prefix)


async def test_a_fresh_schema_made_at_once_is_the_one_the_steps_make(
        db_url: str, prefix: str) -> None:
    """A database without the prefix's tables gets the latest schema in one pass; one where
    any of them exists (here the version table, empty: a migrator that died at once) runs
    every step. Both end with the same tables, columns, indexes and recorded versions."""
    stepped = f"{prefix}s_"
    fresh, steps = Broker(db_url, table_prefix=prefix), Broker(db_url, table_prefix=stepped)
    try:
        async with steps.db.begin() as conn:
            await conn.run_sync(lambda c: steps.schema.version.create(c))
        assert await fresh.migrate() == await steps.migrate() == SCHEMA_VERSION

        def shape(conn: Any, schema: Any) -> dict[str, Any]:
            look, cut = inspect(conn), len(schema.prefix)
            return {t.name[cut:]: (
                sorted((c["name"], str(c["type"]), c["nullable"])
                       for c in look.get_columns(t.name)),
                sorted((ix["name"].replace(schema.prefix, "", 1), ix["column_names"],
                        bool(ix["unique"]), _partial(conn, ix))
                       for ix in look.get_indexes(t.name)))
                for t in schema.tables}

        shapes, versions = [], []
        for b in (fresh, steps):
            async with b.db.connect() as conn:
                shapes.append(await conn.run_sync(shape, b.schema))
                versions.append(sorted((await conn.execute(
                    select(b.schema.version.c.version))).scalars()))
        assert shapes[0] == shapes[1]
        assert len(shapes[0]) == len(fresh.schema.metadata.tables)  # every table of the prefix
        assert versions[0] == versions[1] == list(range(1, SCHEMA_VERSION + 1))
    finally:
        for b in (fresh, steps):
            await b.close()
        drop_tables(db_url, prefix)
        drop_tables(db_url, stepped)


async def test_an_older_schema_is_refused_until_migrated(broker: Broker) -> None:
    async with broker.db.begin() as conn:
        await conn.execute(delete(broker.schema.version)
                           .where(broker.schema.version.c.version == SCHEMA_VERSION))
    if SCHEMA_VERSION > 1:
        with pytest.raises(SchemaError, match=f"version {SCHEMA_VERSION - 1}.*sqlmq migrate"):
            await broker.check_schema()
    else:
        with pytest.raises(SchemaError, match="sqlmq migrate"):
            await broker.check_schema()
    assert await broker.migrate() == SCHEMA_VERSION
    await broker.check_schema()


async def test_a_newer_schema_asks_for_a_newer_package(broker: Broker) -> None:
    from datetime import UTC, datetime

    async with broker.db.begin() as conn:
        await conn.execute(broker.schema.version.insert().values(
            version=SCHEMA_VERSION + 1, applied_at=datetime.now(UTC)))
    with pytest.raises(SchemaError, match="upgrade the sqlmq package"):
        await broker.check_schema()


def test_bad_table_prefixes_are_refused() -> None:
    from sqlmq import ConfigurationError

    for bad in ["", "x; drop table", "A", "1abc", "a" * 31, "with-dash"]:
        with pytest.raises(ConfigurationError, match="table prefix"):
            Broker("sqlite:///x.db", table_prefix=bad)


def _v2_metadata(schema: Any) -> MetaData:
    """The tables as schema version 2 made them: no ``priority`` column anywhere (nor the
    later versions' columns), the ready index ``ix_…_ready`` on ``(queue, next_attempt_at,
    id)`` on every database."""
    md = MetaData()
    later = {"priority", "expires_at", "dedup_key", "saved_state", "defers_count",
             "cancel_requested"}
    for t in schema.metadata.sorted_tables:
        old = Table(t.name, md, *[c._copy() for c in t.columns if c.name not in later],
                    **t.dialect_kwargs)
        for ix in t.indexes:
            if ix.name.endswith(("_ready_asc", "_dedup", "_channel_due")):
                continue
            columns = (["queue", "next_attempt_at", "id"] if ix.name.endswith("_ready")
                       else [c.name for c in ix.columns])
            Index(ix.name, *[old.c[c] for c in columns], **ix.dialect_kwargs)
    return md


async def test_version_3_adds_priority_to_a_version_2_schema_with_rows(
    db_url: str, prefix: str
) -> None:
    """Four brokers migrate a version-2 schema holding messages of every state and archive
    rows at once: the columns and the new ready index appear once, existing rows get
    priority 0, and acquire then takes by priority."""
    from datetime import UTC, datetime, timedelta

    brokers = [Broker(db_url, table_prefix=prefix) for _ in range(4)]
    schema = brokers[0].schema
    old = _v2_metadata(schema)
    now = datetime.now(UTC)
    try:
        async with brokers[0].db.begin() as conn:
            await conn.run_sync(old.create_all)
            m, a, v = (old.tables[t.name] for t in (schema.message, schema.archive,
                                                    schema.version))
            await conn.execute(v.insert(), [{"version": 1, "applied_at": now},
                                            {"version": 2, "applied_at": now}])
            base = {"queue": "q", "headers": {}, "payload": b"x", "attempts_count": 0,
                    "deliveries_count": 0, "created_at": now}
            await conn.execute(m.insert(), [
                {**base, "state": "PENDING", "next_attempt_at": now},
                {**base, "state": "RETRYABLE", "next_attempt_at": now},
                {**base, "state": "PENDING", "next_attempt_at": now + timedelta(hours=1)},
                {**base, "state": "PROCESSING", "next_attempt_at": None,
                 "deliveries_count": 1, "lease_expires_at": now + timedelta(hours=1)},
            ])
            await conn.execute(a.insert(), [{**base, "id": 1000, "state": "COMPLETED",
                                             "archived_at": now}])
        with pytest.raises(SchemaError, match="version 2"):
            await brokers[0].check_schema()

        versions = await asyncio.gather(*(b.migrate() for b in brokers))
        assert versions == [SCHEMA_VERSION] * 4 and SCHEMA_VERSION == 26
        await brokers[0].check_schema()

        def look(conn: Any) -> tuple[Any, ...]:
            i = inspect(conn)
            cols = {t.name: {c["name"]: c for c in i.get_columns(t.name)}
                    for t in (schema.message, schema.archive, schema.spark_staging)}
            indexes = {ix["name"]: ix for ix in i.get_indexes(schema.message.name)}
            ready = [ix for name, ix in indexes.items()
                     if name in (f"ix_{schema.message.name}_ready",
                                 f"ix_{schema.message.name}_ready_asc")]
            return cols, ready, indexes.get(f"ix_{schema.message.name}_due")

        async with brokers[0].db.connect() as conn:
            cols, ready, due = await conn.run_sync(look)
            mysql = conn.dialect.name in ("mysql", "mariadb")
            recorded = (await conn.execute(select(schema.version.c.version)
                                           .order_by(schema.version.c.version))).scalars().all()
            kept = (await conn.execute(select(schema.message.c.id, schema.message.c.priority)
                                       .order_by(schema.message.c.id))).all()
            archived = (await conn.execute(select(schema.archive.c.priority))).scalars().all()
        for table in cols.values():
            assert table["priority"]["nullable"] is False
        (index,) = ready
        assert index["column_names"] == ["queue", "priority", "next_attempt_at", "id"]
        # priority descending, but ascending in MySQL's and MariaDB's ix_…_ready_asc
        assert index["name"].endswith("_ready_asc") == mysql
        if "column_sorting" in index:  # where the dialect reflects it
            assert index["column_sorting"].get("priority", ())[:1] == ("desc",)
        assert due is None  # (version 3 made it on MySQL and MariaDB; version 4 drops it)
        assert recorded == list(range(1, SCHEMA_VERSION + 1))
        assert [r.priority for r in kept] == [0, 0, 0, 0]
        # version 5: expires_at, nullable, on the message table only; old rows never expire
        assert cols[schema.message.name]["expires_at"]["nullable"] is True
        assert "expires_at" not in cols[schema.archive.name]
        async with brokers[0].db.connect() as conn:
            assert (await conn.execute(select(schema.message.c.expires_at))).scalars().all() \
                == [None] * 4
        assert archived == [0]
        # version 6: dedup_key, nullable, and its unique index per queue
        assert cols[schema.message.name]["dedup_key"]["nullable"] is True
        async with brokers[0].db.connect() as conn:
            dedup = await conn.run_sync(lambda c: {
                ix["name"]: ix for ix in inspect(c).get_indexes(schema.message.name)
            }[f"ux_{schema.message.name}_dedup"])
        assert dedup["unique"] and dedup["column_names"] == ["queue", "dedup_key"]
        # version 7: the consumer groups of topics
        async with brokers[0].db.connect() as conn:
            assert await conn.run_sync(
                lambda c: inspect(c).has_table(schema.topic_group.name))
        # version 9: defer and cancellation; old rows have saved nothing and are not flagged
        assert cols[schema.message.name]["defers_count"]["nullable"] is False
        async with brokers[0].db.connect() as conn:
            m = schema.message
            assert (await conn.execute(select(m.c.saved_state, m.c.defers_count,
                                              m.c.cancel_requested))).all() == [(None, 0, 0)] * 4
        pending, retryable = kept[0].id, kept[1].id

        # The migrated table works: a new high-priority message goes before the old ones.
        (urgent,) = await brokers[0].publish_batch("q", [b"urgent"], priority=5)
        taken = await brokers[0].engine.acquire(["q"], 10, 30)
        assert [d.id for d in taken] == [urgent, pending, retryable]
        assert [d.priority for d in taken] == [5, 0, 0]
        assert [(d.defers, d.cancel_requested) for d in taken] == [(0, False)] * 3
        first = await brokers[0].publish("q", b"keyed", dedup_key="k")
        again = await brokers[0].publish("q", b"keyed", dedup_key="k")
        assert (int(again), again.duplicate, first.duplicate) == (first, True, False)
    finally:
        for b in brokers:
            await b.close()
        drop_tables(db_url, prefix)


@pytest.mark.parametrize("db_kind", ["mariadb"])
async def test_version_4_replaces_the_indexes_version_3_made(db_url: str, prefix: str) -> None:
    """A MariaDB schema as version 3 first left it (the ready index ``(queue, priority DESC,
    next_attempt_at, id)`` and the due index ``(queue, next_attempt_at)``): version 4 makes
    ``ix_…_ready_asc``, drops both, keeps the rows, and acquire works."""
    from datetime import UTC, datetime

    broker = Broker(db_url, table_prefix=prefix)
    schema = broker.schema
    m = schema.message.name
    try:
        async with broker.db.begin() as conn:
            await conn.run_sync(schema.metadata.create_all)
            await conn.exec_driver_sql(f"DROP INDEX ix_{m}_ready_asc ON {m}")
            await conn.execute(schema.version.insert(), [
                {"version": v, "applied_at": datetime.now(UTC)} for v in (1, 2, 3)])
            stand_in = MetaData()
            old = Table(m, stand_in, *[c._copy() for c in schema.message.columns])
            Index(f"ix_{m}_due", old.c.queue, old.c.next_attempt_at)
            Index(f"ix_{m}_ready", old.c.queue, old.c.priority.desc(), old.c.next_attempt_at,
                  old.c.id)
            await conn.run_sync(lambda c: [ix.create(c) for t in stand_in.sorted_tables
                                           for ix in t.indexes])
        (msg_id,) = await broker.publish_batch("q", [b"kept"])
        with pytest.raises(SchemaError, match="version 3"):
            await broker.check_schema()


        async def indexes() -> set[str]:
            async with broker.db.connect() as conn:
                return await conn.run_sync(
                    lambda c: {ix["name"] for ix in inspect(c).get_indexes(m)})

        assert {f"ix_{m}_due", f"ix_{m}_ready"} <= await indexes()
        assert await broker.migrate() == SCHEMA_VERSION == 26
        names = await indexes()
        assert f"ix_{m}_ready_asc" in names
        assert not {f"ix_{m}_due", f"ix_{m}_ready"} & names
        assert [d.id for d in await broker.engine.acquire(["q"], 10, 30)] == [msg_id]
        assert await broker.migrate() == SCHEMA_VERSION  # and again: nothing to do
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_version_11_adds_the_operations_tables_to_a_version_10_schema(
        db_url: str, prefix: str) -> None:
    """A version-10 schema holding a message: four brokers migrate it at once; the workers
    registry and the pause table appear (nothing else changes), the message is kept, and
    pausing and acquiring work on the result."""
    from datetime import UTC, datetime

    brokers = [Broker(db_url, table_prefix=prefix) for _ in range(4)]
    schema = brokers[0].schema
    new = {schema.worker.name, schema.queue_pause.name}
    try:
        async with brokers[0].db.begin() as conn:
            await conn.run_sync(lambda c: schema.metadata.create_all(
                c, tables=[t for t in schema.metadata.sorted_tables if t.name not in new]))
            await conn.execute(schema.version.insert(), [
                {"version": v, "applied_at": datetime.now(UTC)} for v in range(1, 11)])
        (kept,) = await brokers[0].publish_batch("q", [b"kept"])
        with pytest.raises(SchemaError, match="version 10"):
            await brokers[0].check_schema()

        async def tables() -> set[str]:
            async with brokers[0].db.connect() as conn:
                return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))

        assert not new & await tables()
        versions = await asyncio.gather(*(b.migrate() for b in brokers))
        assert versions == [SCHEMA_VERSION] * 4 and SCHEMA_VERSION == 26
        assert new <= await tables()
        await brokers[0].check_schema()
        assert await brokers[0].pause("q")
        assert await brokers[0].engine.acquire(["q"], 10, 30) == []
        assert await brokers[1].resume("q")
        assert [d.id for d in await brokers[1].engine.acquire(["q"], 10, 30)] == [kept]
        assert await brokers[0].migrate() == SCHEMA_VERSION  # and again: nothing to do
    finally:
        for b in brokers:
            await b.close()
        drop_tables(db_url, prefix)


async def test_version_12_adds_the_archives_channel_to_a_version_11_schema(
        db_url: str, prefix: str) -> None:
    """A version-11 archive (no ``channel`` column) holding a dead letter: four brokers
    migrate it at once; the column appears, the row is kept, and it requeues."""
    from datetime import UTC, datetime

    from sqlalchemy import text

    brokers = [Broker(db_url, table_prefix=prefix) for _ in range(4)]
    schema = brokers[0].schema
    a = schema.archive
    try:
        async with brokers[0].db.begin() as conn:
            await conn.run_sync(lambda c: schema.metadata.create_all(c))
            await conn.execute(text(f"ALTER TABLE {a.name} DROP COLUMN channel"))
            await conn.execute(schema.version.insert(), [
                {"version": v, "applied_at": datetime.now(UTC)} for v in range(1, 12)])
            now = datetime.now(UTC)
            await conn.execute(text(
                f"INSERT INTO {a.name} (id, queue, headers, payload, state, attempts_count, "
                "deliveries_count, created_at, archived_at, priority) VALUES (7, 'q', '{}', "
                ":p, 'FAILED', 1, 1, :t, :t, 0)"), {"p": b"dead", "t": now.replace(tzinfo=None)})
        with pytest.raises(SchemaError, match="version 11"):
            await brokers[0].check_schema()

        async def columns() -> set[str]:
            async with brokers[0].db.connect() as conn:
                return {c["name"] for c in await conn.run_sync(
                    lambda c: inspect(c).get_columns(a.name))}

        assert "channel" not in await columns()
        versions = await asyncio.gather(*(b.migrate() for b in brokers))
        assert versions == [SCHEMA_VERSION] * 4 and SCHEMA_VERSION == 26
        assert "channel" in await columns()
        view = await brokers[0].insights().message(7)
        assert view is not None and (view.state, view.channel, view.payload) == (
            "FAILED", None, b"dead")
        assert await brokers[1].requeue(ids=[7]) == 1
        assert [d.id for d in await brokers[1].engine.acquire(["q"], 10, 30)] == [7]
    finally:
        for b in brokers:
            await b.close()
        drop_tables(db_url, prefix)


async def test_version_13_gives_the_waiting_channel_messages_their_turns(
        db_url: str, prefix: str) -> None:
    """A version-12 schema (no fair order) holding channel messages: four brokers migrate
    it at once; each channel's n-th message gets turn n, so the acquire after it takes
    them round-robin (a turn's quantum of ``TURN_QUANTUM`` at a time), and a publish after
    it follows on."""
    from sqlalchemy import text

    brokers = [Broker(db_url, table_prefix=prefix) for _ in range(4)]
    schema = brokers[0].schema
    m, c = schema.message, schema.channel
    q = TURN_QUANTUM
    try:
        await brokers[0].migrate()
        a = await brokers[0].publish_batch("q", [b"a"] * (q + 1), channel="a")
        (b1,) = await brokers[0].publish_batch("q", [b"b1"], channel="b")
        async with brokers[0].db.begin() as conn:
            for index in ("fair", "channel_key", "channel_due", "channel"):  # 14 the third
                await conn.execute(text(_drop_index(db_url, f"ix_{m.name}_{index}", m.name)))
            await conn.execute(text(  # version 10's, before 18 left fair_key in its condition
                f"CREATE INDEX ix_{m.name}_channel ON {m.name} (channel, state, channel_due_at)"
                + ("" if db_url.startswith(("mysql", "mariadb"))
                   else " WHERE channel IS NOT NULL")))
            await conn.execute(text(f"ALTER TABLE {m.name} DROP COLUMN fair_key"))
            await conn.execute(text(f"ALTER TABLE {c.name} DROP COLUMN last_turn"))
            await conn.execute(text(f"DROP TABLE {schema.channel_clock.name}"))
            await conn.execute(schema.version.delete().where(schema.version.c.version >= 13))
        with pytest.raises(SchemaError, match="version 12"):
            await brokers[0].check_schema()
        versions = await asyncio.gather(*(b.migrate() for b in brokers))
        assert versions == [SCHEMA_VERSION] * 4 and SCHEMA_VERSION == 26
        await brokers[0].check_schema()
        got = await brokers[1].engine.acquire(["q"], q + 1, 30)
        assert [d.id for d in got] == [*a[:q], b1]  # a's first quantum, then b's turn
        (b2,) = await brokers[1].publish_batch("q", [b"b2"], channel="b")
        got = await brokers[1].engine.acquire(["q"], 3, 30)
        assert [d.id for d in got] == [b2, a[q]]  # b's turn 2 is in the round of turn 1
        assert await brokers[0].migrate() == SCHEMA_VERSION  # and again: nothing to do
    finally:
        for b in brokers:
            await b.close()
        drop_tables(db_url, prefix)


def _partial(conn: Any, index: dict[str, Any]) -> str | None:
    """A reflected index's condition (PostgreSQL and SQLite; None where it has none)."""
    where = (index.get("dialect_options") or {}).get(f"{conn.dialect.name}_where")
    return None if where is None else " ".join(str(where).replace("(", "").replace(
        ")", "").split())


def _drop_index(url: str, name: str, table: str) -> str:
    return f"DROP INDEX {name}" + (f" ON {table}" if url.startswith(("mysql", "mariadb"))
                                   else "")


async def test_version_14_brings_ordered_channels_into_the_fair_order(
        db_url: str, prefix: str) -> None:
    """A version-13 schema where ordered channels were outside the fair order (no keys):
    an ordered channel of its own and one by its queue's default, each holding a running
    message and waiting ones of mixed priorities. After the migration the running one still
    holds its channel back, then the rest start one at a time in publish order, the
    priorities left out, round-robin with a channel without limits."""
    from sqlalchemy import update

    broker = Broker(db_url, table_prefix=prefix)
    m = broker.schema.message
    try:
        await broker.migrate()
        await broker.set_channel("own", ordered=True)
        await broker.set_channel_default("q", ordered=True)
        own = [await broker.publish("q", b"o", channel="own", priority=p) for p in (0, 0, 9)]
        by_default = [await broker.publish("q", b"d", channel="dflt", priority=p)
                      for p in (5, 0)]
        await broker.set_channel("free", max_size=100)  # configured: no default, no limits
        free = await broker.publish_batch("q", [b"f1", b"f2"], channel="free")
        (running,) = await broker.engine.acquire(["q"], 1, 30)
        assert running.id == own[0]
        await _migrated_from(
            broker, 14,
            update(m).where(m.c.channel.in_(["own", "dflt"])).values(fair_key=None),
            _drop_index(db_url, f"ix_{m.name}_channel_key", m.name))
        await broker.check_schema()
        got = await broker.engine.acquire(["q"], 10, 30)
        assert sorted(d.id for d in got) == sorted([by_default[0], free[0], free[1]])
        assert {d.id: d.holds_slot for d in got}[by_default[0]]
        await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE)
                                    for d in [running, *got]])
        got = await broker.engine.acquire(["q"], 10, 30)
        assert sorted(d.id for d in got) == sorted([own[1], by_default[1]])
        await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE) for d in got])
        assert [d.id for d in await broker.engine.acquire(["q"], 10, 30)] == [own[2]]
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_version_15_gives_every_database_the_limited_channels_pick_index(
        db_url: str, prefix: str) -> None:
    """Version 14 made the index ``(channel, priority DESC, channel_due_at, id)`` on
    PostgreSQL and SQLite only: a version-14 schema without it (as MySQL and MariaDB had)
    gets it, and the limited pick that reads it still takes each channel's messages by
    priority, then due time."""
    from sqlalchemy import inspect

    broker = Broker(db_url, table_prefix=prefix)
    m = broker.schema.message
    name = f"ix_{m.name}_channel_due"
    try:
        await broker.migrate()
        await broker.set_channel_default("q", max_concurrency=2)
        low = await broker.publish_batch("q", [b"l1", b"l2"], channel="a")
        (high,) = await broker.publish_batch("q", [b"h"], channel="a", priority=5)
        (other,) = await broker.publish_batch("q", [b"o"], channel="b")
        await _migrated_from(broker, 15, _drop_index(db_url, name, m.name))
        async with broker.db.connect() as conn:
            names = await conn.run_sync(
                lambda c: {ix["name"] for ix in inspect(c).get_indexes(m.name)})
        assert name in names
        got = await broker.engine.acquire(["q"], 10, 30)
        assert sorted(d.id for d in got) == sorted([high, low[0], other])
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_version_16_adds_the_channels_size_bound_to_a_version_15_schema(
        db_url: str, prefix: str) -> None:
    """A version-15 schema has no ``size_bound``: after the migration the column is there
    (NULL for the channels it had), and a channel's ``max_size`` still counts what it
    held before."""
    from sqlmq import ChannelFull

    broker = Broker(db_url, table_prefix=prefix)
    c = broker.schema.channel
    try:
        await broker.migrate()
        await broker.set_channel("c", max_size=3, queue="q")
        await broker.publish_batch("q", [b"a", b"b"], channel="c")
        await _migrated_from(broker, 16, f"ALTER TABLE {c.name} DROP COLUMN size_bound")
        async with broker.db.connect() as conn:
            assert (await conn.execute(select(c.c.size_bound))).scalars().all() == [None]
        await broker.publish("q", b"c", channel="c")
        with pytest.raises(ChannelFull, match="'c' holds 3 messages"):
            await broker.publish("q", b"d", channel="c")
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def _migrated_from(broker: Broker, version: int, *changes: Any) -> None:
    """Take ``broker``'s schema back to what version ``version - 1`` left (``changes``: SQL
    text or statements, in one transaction with forgetting the versions from ``version``
    on), check that the broker refuses it, and migrate it to the current version."""
    from sqlalchemy import text

    async with broker.db.begin() as conn:
        for change in changes:
            await conn.execute(text(change) if isinstance(change, str) else change)
        await conn.execute(broker.schema.version.delete()
                           .where(broker.schema.version.c.version >= version))
    with pytest.raises(SchemaError, match=f"version {version - 1}"):
        await broker.check_schema()
    assert await broker.migrate() == SCHEMA_VERSION == 26


async def _index_back_to(broker: Broker, db_url: str, name: str, columns: str,
                         where: str, version: int) -> str | None:
    """Put index ``name`` of the message table back as version ``version - 1`` made it
    (``columns``, and ``where`` where an index can be partial), forget the versions from
    ``version`` on, migrate, and return the index's condition as it is then."""
    m = broker.schema.message.name
    whole = db_url.startswith(("mysql", "mariadb"))
    await _migrated_from(broker, version, _drop_index(db_url, name, m),
                         f"CREATE INDEX {name} ON {m} ({columns})"
                         + ("" if whole else f" WHERE {where}"))
    async with broker.db.connect() as conn:
        return await conn.run_sync(lambda c: next(
            _partial(c, ix) for ix in inspect(c).get_indexes(m) if ix["name"] == name))


async def test_version_17_leaves_channels_without_limits_out_of_the_limited_pick_index(
        db_url: str, prefix: str) -> None:
    """Version 16's limited channels' pick index held every waiting channel message; 17
    makes it anew with the messages of limited channels only (no ``fair_key``), where an
    index can be partial, and leaves MySQL's and MariaDB's whole one as it was. Limited
    and ordered channels are served as before, from the rows the older schema wrote."""
    broker = Broker(db_url, table_prefix=prefix)
    try:
        await broker.migrate()
        await broker.set_channel_default("q", max_concurrency=1)
        await broker.set_channel("o", ordered=True, queue="q")
        limited = await broker.publish_batch("q", [b"l1", b"l2"], channel="a")
        ordered = await broker.publish_batch("q", [b"o1", b"o2"], channel="o")
        partial = await _index_back_to(
            broker, db_url, f"ix_{broker.schema.message.name}_channel_due",
            "channel, priority DESC, channel_due_at, id", "channel_due_at IS NOT NULL", 17)
        if db_url.startswith(("mysql", "mariadb")):
            assert partial is None
        else:
            assert partial is not None and "fair_key IS NULL" in partial
        got = await broker.engine.acquire(["q"], 10, 30)
        assert sorted(d.id for d in got) == sorted([limited[0], ordered[0]])
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_version_18_leaves_channels_without_limits_out_of_the_running_count_index(
        db_url: str, prefix: str) -> None:
    """Version 17's running count index held every channel message; 18 makes it anew on
    PostgreSQL with the messages of limited channels only (no ``fair_key``), and leaves
    SQLite's, MySQL's and MariaDB's as they were (20 then makes SQLite's so). A limited
    channel's running delivery still holds its limit, and a channel without limits is
    served."""
    broker = Broker(db_url, table_prefix=prefix)
    try:
        running, waiting = await _limited_one_running(broker)
        partial = await _index_back_to(
            broker, db_url, f"ix_{broker.schema.message.name}_channel",
            "channel, state, channel_due_at", "channel IS NOT NULL", 18)
        if db_url.startswith(("mysql", "mariadb")):
            assert partial is None
        else:
            assert partial == "channel IS NOT NULL AND fair_key IS NULL"
        await _limit_still_held(broker, running, waiting)
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def _limited_one_running(broker: Broker) -> tuple[Delivery, int]:
    """Channel ``a`` of queue ``q`` limited to one at a time with two messages, a channel
    ``f`` without limits with two: an acquire starts ``a``'s first and both of ``f``'s.
    The running delivery of ``a`` and the id of its waiting second."""
    await broker.migrate()
    await broker.set_channel("a", max_concurrency=1, queue="q")
    limited = await broker.publish_batch("q", [b"l1", b"l2"], channel="a")
    free = await broker.publish_batch("q", [b"f1", b"f2"], channel="f")
    first = {d.id: d for d in await broker.engine.acquire(["q"], 10, 30)}
    assert set(first) == {limited[0], *free}
    return first[limited[0]], limited[1]


async def _limit_still_held(broker: Broker, running: Delivery, next_id: int) -> None:
    """Channel ``running``'s one slot is taken (nothing acquired) until it settles, then its
    next message ``next_id`` starts."""
    assert await broker.engine.acquire(["q"], 10, 30) == []
    assert await broker.engine.settle(
        [Settlement(running.id, running.deliveries, Outcome.COMPLETE)]) == {running.id}
    assert [d.id for d in await broker.engine.acquire(["q"], 10, 30)] == [next_id]


async def test_version_20_leaves_channels_without_limits_out_of_sqlites_running_count_index(
        db_url: str, prefix: str) -> None:
    """Version 19's running count index on SQLite held every channel message; 20 makes it
    anew with the messages of limited channels only, as 18 did on PostgreSQL, whose index
    it leaves alone (not made again: the same relation), as MySQL's and MariaDB's. A
    limited channel's running delivery holds its limit, counted from the new index."""
    from sqlalchemy import text

    broker = Broker(db_url, table_prefix=prefix)
    name = f"ix_{broker.schema.message.name}_channel"
    try:
        running, waiting = await _limited_one_running(broker)
        if db_url.startswith("sqlite"):
            partial = await _index_back_to(broker, db_url, name,
                                           "channel, state, channel_due_at",
                                           "channel IS NOT NULL", 20)
            assert partial == "channel IS NOT NULL AND fair_key IS NULL"
        elif db_url.startswith("postgresql"):
            relation = text(f"SELECT '{name}'::regclass::oid")
            async with broker.db.connect() as conn:
                before = (await conn.execute(relation)).scalar()
            await _migrated_from(broker, 20)
            async with broker.db.connect() as conn:
                assert (await conn.execute(relation)).scalar() == before
        else:
            await _migrated_from(broker, 20)
        await _limit_still_held(broker, running, waiting)
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_version_19_marks_the_ordered_channels_messages(db_url: str, prefix: str) -> None:
    """A version-18 schema has no ``ordered`` column: the migration adds it, marks the keyed
    messages of the channels ordered without other limits (by their own settings or their
    queue's default) and no others, and the fair acquire then holds an ordered channel's
    followers back behind its running head, from those marks alone."""
    broker = Broker(db_url, table_prefix=prefix)
    m = broker.schema.message
    try:
        await broker.migrate()
        await broker.set_channel("own", ordered=True, queue="q")
        await broker.set_channel_default("q", ordered=True)
        await broker.set_channel("free", max_size=100, queue="q")  # no limits, not ordered
        await broker.set_channel("lim", ordered=True, max_concurrency=1, queue="q")
        own = await broker.publish_batch("q", [b"o1", b"o2"], channel="own")
        by_default = await broker.publish_batch("q", [b"d1", b"d2"], channel="dflt")
        free = await broker.publish_batch("q", [b"f1", b"f2"], channel="free")
        lim = await broker.publish_batch("q", [b"l1", b"l2"], channel="lim")
        await _migrated_from(broker, 19, f"ALTER TABLE {m.name} DROP COLUMN ordered")
        await broker.check_schema()
        async with broker.db.connect() as conn:
            marks = dict((await conn.execute(select(m.c.id, m.c.ordered))).all())
        assert marks == {**dict.fromkeys([*own, *by_default], 1),
                         **dict.fromkeys([*free, *lim], 0)}
        got = await broker.engine.acquire(["q"], 10, 30)
        assert sorted(d.id for d in got) == sorted([own[0], by_default[0], *free, lim[0]])
        assert await broker.engine.acquire(["q"], 10, 30) == []
        await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE)
                                    for d in got])
        got = await broker.engine.acquire(["q"], 10, 30)
        assert sorted(d.id for d in got) == sorted([own[1], by_default[1], lim[1]])
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_version_21_adds_the_inbox_ledger_to_a_version_20_schema(
        db_url: str, prefix: str) -> None:
    """A version-20 schema with messages has no inbox ledger: the migration makes the table
    (the messages untouched), whose primary key refuses a key taken twice from one source
    and takes it from another."""
    from datetime import UTC, datetime

    from sqlalchemy.exc import IntegrityError

    broker = Broker(db_url, table_prefix=prefix)
    seen = broker.schema.inbox_seen
    try:
        await broker.migrate()
        ids = await broker.publish_batch("q", [b"a", b"b"])
        await _migrated_from(broker, 21, f"DROP TABLE {seen.name}")
        now = datetime.now(UTC)
        row = {"source": "amqp:/orders", "msg_key": "m-1", "message_id": ids[0],
               "taken_at": now}
        async with broker.db.begin() as conn:
            await conn.execute(seen.insert(), [row, {**row, "source": "amqp:/refunds"}])
        with pytest.raises(IntegrityError):
            async with broker.db.begin() as conn:
                await conn.execute(seen.insert(), [{**row, "message_id": ids[1]}])
        async with broker.db.connect() as conn:
            got = (await conn.execute(select(seen.c.source, seen.c.message_id)
                                      .order_by(seen.c.source))).all()
        assert [tuple(r) for r in got] == [("amqp:/orders", ids[0]), ("amqp:/refunds", ids[0])]
        assert [r["id"] for r in await rows(broker, "message")] == ids
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_version_22_adds_the_archives_result_to_a_version_21_schema(
        db_url: str, prefix: str) -> None:
    """A version-21 archive has no ``result`` column: the migration adds it (NULL: nothing
    kept), the rows archived before untouched, and a result kept afterwards reads back."""
    from sqlmq.codec import decode_state

    broker = Broker(db_url, table_prefix=prefix)
    a = broker.schema.archive
    try:
        await broker.migrate()
        (old,) = await broker.publish_batch("q", [b"before"])
        (d,) = await broker.engine.acquire(["q"], 10, 30)
        assert await broker.engine.settle([Settlement(d.id, 1, Outcome.COMPLETE)]) == {old}
        await _migrated_from(broker, 22, f"ALTER TABLE {a.name} DROP COLUMN result")
        (new,) = await broker.publish_batch("q", [b"after"])
        (d,) = await broker.engine.acquire(["q"], 10, 30)
        kept = Settlement(d.id, 1, Outcome.COMPLETE, result=b"text/plain\nthumb",
                          answers=True)
        assert await broker.engine.settle([kept]) == {new}
        found = {r["id"]: r for r in await rows(broker, "archive")}
        assert found[old]["result"] is None and found[old]["payload"] == b"before"
        assert decode_state(found[new]["result"]) == "thumb"
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_version_23_adds_the_workflow_tables_to_a_version_22_schema(
        db_url: str, prefix: str) -> None:
    """A version-22 schema has no step and signal tables, and no ``waits_for``: the
    migration makes them, the messages already there untouched, and a workflow published
    afterwards runs its steps in turn."""
    from sqlmq.workflows.records import STEP_HEADER, WORKFLOW_HEADER, StepSpec

    broker = Broker(db_url, table_prefix=prefix)
    try:
        await broker.migrate()
        (old,) = await broker.publish_batch("q", [b"before"])
        await _migrated_from(broker, 23, f"DROP TABLE {broker.schema.step_need.name}",
                             f"DROP TABLE {broker.schema.step.name}",
                             f"DROP TABLE {broker.schema.signal.name}",
                             f"ALTER TABLE {broker.schema.message.name} DROP COLUMN waits_for")
        headers = {WORKFLOW_HEADER: "w", STEP_HEADER: "a"}
        a, b = await broker.engine.publish_workflow("w", [
            StepSpec("a", NewMessages("q", [b"a"], [headers])),
            StepSpec("b", NewMessages("q", [b"b"], [{**headers, STEP_HEADER: "b"}]), [0])])
        got = await broker.engine.acquire(["q"], 10, 30)
        assert sorted(d.id for d in got) == [old, a]
        step = next(d for d in got if d.id == a)
        assert await broker.engine.settle(
            [Settlement(a, step.deliveries, Outcome.COMPLETE, step=True)]) == {a}
        assert [d.id for d in await broker.engine.acquire(["q"], 10, 30)] == [b]
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_version_24_gives_the_message_table_its_storage_parameters(
        db_url: str, prefix: str) -> None:
    """PostgreSQL's message table is created, or altered by the migration from version 23,
    with pages filled to half (:data:`sqlmq.schema.MESSAGE_STORAGE`); the other databases
    have no such parameter and only record the version."""
    from sqlalchemy import text

    broker = Broker(db_url, table_prefix=prefix)
    m = broker.schema.message.name
    postgres = db_url.startswith("postgresql")

    async def fillfactor() -> list[str]:
        async with broker.db.connect() as conn:
            found = (await conn.execute(text(
                "SELECT reloptions FROM pg_class WHERE relname = :t"), {"t": m})).scalar()
        return [o for o in found or [] if o.startswith("fillfactor")]

    try:
        await broker.migrate()
        if postgres:
            assert await fillfactor() == ["fillfactor=50"]
        await _migrated_from(broker, 24, *([f"ALTER TABLE {m} RESET (fillfactor)"]
                                           if postgres else []))
        if postgres:
            assert await fillfactor() == ["fillfactor=50"]
        await broker.publish("q", "after")
        assert len(await broker.engine.acquire(["q"], 10, 30)) == 1
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_version_25_adds_the_schedules_pause_to_a_version_24_schema(
        db_url: str, prefix: str) -> None:
    """A version-24 schedule table has no ``paused_at``: the migration adds it (NULL: the
    schedules registered before run on), and a pause written afterwards holds."""
    broker = Broker(db_url, table_prefix=prefix)
    s = broker.schema.schedule
    try:
        await broker.migrate()
        nightly = broker.periodic("nightly", cron="0 3 * * *", body=1)
        await broker.engine.register_schedule(nightly)
        await _migrated_from(broker, 25, f"ALTER TABLE {s.name} DROP COLUMN paused_at")
        (info,) = await broker.schedules()
        assert (info.name, info.paused_at) == ("nightly", None)
        assert await broker.pause_schedule("nightly") is True
        (info,) = await broker.schedules()
        assert info.paused
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


@pytest.mark.parametrize("db_kind", ["mariadb"])
async def test_the_migration_lock_is_released_only_after_the_commit(
        db_url: str, prefix: str) -> None:
    """MariaDB's migration lock outlives the transaction: released before the COMMIT, it let
    another migrator read the version without the last rows and apply those steps again
    (a duplicate version row). When it is released, another connection sees them all."""
    from sqlalchemy import create_engine, func, select

    from sqlmq.connect import parse_url, sync_url

    broker = Broker(db_url, table_prefix=prefix)
    engine = broker.engine
    seen: list[int] = []
    other = create_engine(sync_url(parse_url(db_url)))
    take = engine._migration_lock  # type: ignore[attr-defined]

    def lock(conn: Any) -> Any:
        release = take(conn)

        def looked_then_released() -> None:
            with other.connect() as c:
                seen.append(c.execute(select(func.max(broker.schema.version.c.version)))
                            .scalar_one())
            release()

        return looked_then_released

    engine._migration_lock = lock  # type: ignore[attr-defined]
    try:
        assert await broker.migrate() == SCHEMA_VERSION
        assert seen == [SCHEMA_VERSION]
    finally:
        other.dispose()
        await broker.close()
        drop_tables(db_url, prefix)
