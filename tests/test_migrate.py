"""Schema creation, versions, and the refusal to run on a missing or old schema."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import delete, func, inspect, select

from sqlmq import SCHEMA_VERSION, Broker, Message, SchemaError

from .conftest import drop_tables


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
