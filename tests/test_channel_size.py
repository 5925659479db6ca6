"""``max_size`` without counting the channel on every publish (schema version 16): a
publish that fits under the channel's size bound does not count its messages; one that
may not fit counts, and only the count refuses it (``core_room._sized``; the contract's
tests hold the refusals exact on all four engines). Here: when the SQL engines count."""

from __future__ import annotations

from typing import Any

import pytest

from sqlmq import Broker, ChannelFull


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb", "sqlite"])
async def test_a_publish_under_max_size_counts_the_channel_only_near_the_limit(
        broker: Broker) -> None:
    """The count behind ``max_size`` reads every message of the channel (20 ms a publish
    with 50,000 of them): a publish that fits under the channel's size bound does
    without it, and one that may not fit counts."""
    from sqlalchemy import event

    counts: list[str] = []

    def look(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "count(" in statement.lower():
            counts.append(statement)

    await broker.set_channel("c", max_size=6, queue="jobs")
    event.listen(broker.db.sync_engine, "before_cursor_execute", look)
    try:
        await broker.publish("jobs", "first", channel="c")  # the bound unknown: counted
        assert len(counts) == 1
        for n in range(4):
            await broker.publish("jobs", n, channel="c")
        assert len(counts) == 1  # 5 of 6: within the bound
        with pytest.raises(ChannelFull):
            await broker.publish_batch("jobs", ["x", "y"], channel="c")  # over: counted
        assert len(counts) == 2
    finally:
        event.remove(broker.db.sync_engine, "before_cursor_execute", look)


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb", "sqlite"])
async def test_a_publish_reads_its_queues_default_with_the_channel_on_sqlite(
        broker: Broker) -> None:
    """A channel without settings of its own follows its queue's default, read at every
    publish: on SQLite in the statement that reads the channel's row (its write
    transaction locks everything already), elsewhere by a statement of its own under a
    shared lock. Either way a change of the default applies to the next publish."""
    from sqlalchemy import event

    statements: list[str] = []

    def look(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    await broker.set_channel_default("jobs", max_size=2)
    await broker.publish("jobs", "made", channel="c")  # the channel's row made
    event.listen(broker.db.sync_engine, "before_cursor_execute", look)
    try:
        await broker.publish("jobs", "second", channel="c")
        with pytest.raises(ChannelFull):
            await broker.publish("jobs", "third", channel="c")
        insert = f"INSERT INTO {broker.schema.message.name} "
        first = statements[:next(i for i, s in enumerate(statements) if insert in s)]
        default = broker.schema.channel_default.name
        reads = [s for s in first if default in s]
        assert len(reads) == 1
        joined = broker.db.dialect.name == "sqlite"
        assert (f"{broker.schema.channel.name}." in reads[0]) == joined  # the row's columns
        await broker.set_channel_default("jobs", max_size=3)
        await broker.publish("jobs", "third", channel="c")
    finally:
        event.remove(broker.db.sync_engine, "before_cursor_execute", look)
