"""Consuming a queue as a Spark stream: each message archived exactly once, and only after
Spark committed the micro-batch that read it; restarts replay the same rows."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from sqlalchemy import select, text

from sqlmq import Broker

from ..conftest import rows, wait_until

pytestmark = pytest.mark.spark


def stream(spark: Any, opts: dict[str, str], **extra: Any) -> Any:
    return spark.readStream.format("sqlmq").options(**opts).options(**extra).load()


async def test_stream_of_ten_thousand_messages_is_archived_exactly_once_over_several_batches(
    spark: Any, broker: Broker, opts: dict[str, str], tmp_path: Path
) -> None:
    await broker.publish_batch("events", [{"n": i} for i in range(10_000)])
    out = tmp_path / "out"
    query = (
        stream(spark, opts, queue="events", consumer="c1", maxMessagesPerBatch=3000)
        .select("id", "body", "deliveries")
        .writeStream.format("parquet").option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True).start()
    )
    query.awaitTermination(600)
    assert query.exception() is None
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [3000, 3000, 3000, 1000]

    written = spark.read.parquet(str(out)).collect()
    assert sorted(json.loads(r.body)["n"] for r in written) == list(range(10_000))
    assert {r.deliveries for r in written} == {1}
    archived = await rows(broker, "archive")
    assert len(archived) == 10_000
    assert {r["state"] for r in archived} == {"COMPLETED"}
    assert {(r["attempts_count"], r["deliveries_count"]) for r in archived} == {(1, 1)}
    assert sorted(r["id"] for r in archived) == sorted(r.id for r in written)
    assert await rows(broker) == []


async def test_killed_stream_restarts_from_its_checkpoint_replaying_the_same_rows_once(
    spark: Any, broker: Broker, opts: dict[str, str], tmp_path: Path
) -> None:
    """Killed after the sink published batch 0 but before Spark recorded its commit (the
    worst moment): the restart replays batch 0 with the same rows, the sqlmq sink sees the
    batch id again and publishes nothing, and the source acknowledges each message once."""
    ids = await broker.publish_batch("in", [{"n": i} for i in range(2000)])
    ck = tmp_path / "ck"
    src = dict(queue="in", consumer="pipe", maxMessagesPerBatch=1000, consumerTimeout=3,
               leaseSeconds=60)

    def start(trigger: dict[str, Any]) -> Any:
        return (
            stream(spark, opts, **src)
            .select(F.col("payload"), F.create_map(F.lit("source-id"), F.col("id").cast("string"))
                    .alias("headers"))
            .writeStream.format("sqlmq").options(**opts).option("queue", "out")
            .option("sink", "pipe-out").option("checkpointLocation", str(ck))
            .trigger(**trigger).start()
        )

    first = start({"processingTime": "1 hour"})  # batch 0 now, then idle for an hour
    await wait_until(lambda: (ck / "commits" / "0").exists(), timeout=300,
                     message="batch 0 committed")
    first.stop()
    # As if killed between the sink's commit and Spark's commit log entry:
    os.remove(ck / "commits" / "0")
    os.remove(ck / "commits" / ".0.crc")
    assert len(await rows(broker, queue="out")) == 1000
    assert await rows(broker, "archive") == []  # nothing acknowledged before Spark's commit

    second = start({"availableNow": True})
    second.awaitTermination(600)
    assert second.exception() is None

    out = await rows(broker, queue="out")
    assert Counter(int(r["headers"]["source-id"]) for r in out) == Counter(ids)
    archived = await rows(broker, "archive")
    assert sorted(r["id"] for r in archived) == ids
    assert {(r["state"], r["deliveries_count"]) for r in archived} == {("COMPLETED", 1)}
    assert await rows(broker, queue="in") == []


async def test_second_running_query_with_the_same_consumer_name_is_refused(
    spark: Any, broker: Broker, opts: dict[str, str], tmp_path: Path
) -> None:
    await broker.publish("jobs", "x")
    src = dict(queue="jobs", consumer="only-one", consumerTimeout=2, leaseSeconds=60)
    first = (stream(spark, opts, **src).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "a")).start())
    await wait_until(lambda: bool(first.recentProgress), timeout=300, message="first batch")
    second = (stream(spark, opts, **src).writeStream.format("noop")
              .option("checkpointLocation", str(tmp_path / "b")).start())
    try:
        with pytest.raises(Exception, match=r"consumer 'only-one'.*held by another running"):
            second.awaitTermination(300)
        assert first.isActive
    finally:
        first.stop()
        second.stop()


async def test_stopped_query_releases_its_consumer_name_so_a_restart_starts_at_once(
    spark: Any, broker: Broker, opts: dict[str, str], tmp_path: Path, db_kind: str
) -> None:
    """Spark ends a stopped query's driver-side Python process with SIGTERM, often while it
    is inside a transaction holding the consumer row (an idle query leases constantly). The
    process must release the name and exit without waiting on its own locks: the restart
    below has a 120 s consumerTimeout, so only a release (not a stale heartbeat) lets it
    start promptly."""
    c = broker.schema.spark_consumer
    await broker.publish("jobs", "a")
    src = dict(queue="jobs", consumer="again", consumerTimeout=120, leaseSeconds=360)
    ck = str(tmp_path / "ck")
    out: list[Any] = []

    def start() -> Any:
        return (stream(spark, opts, **src).select("body").writeStream
                .foreachBatch(lambda df, _: out.extend(r.body for r in df.collect()))
                .option("checkpointLocation", ck).start())

    async def owner() -> Any:
        async with broker.db.connect() as conn:
            return (await conn.execute(select(c.c.owner))).scalar_one()

    first = start()
    await wait_until(lambda: out == ["a"], timeout=300, message="first query's batch")
    await asyncio.sleep(1)  # idle polling: latestOffset leasing in a loop
    assert await owner() is not None
    first.stop()
    await wait_until(lambda: owner_is_none(owner), timeout=10, message="consumer released")

    await broker.publish("jobs", "b")
    t = time.monotonic()
    second = start()
    try:
        await wait_until(lambda: out == ["a", "b"], timeout=100, message="restart's batch")
        assert time.monotonic() - t < 100  # a stale-heartbeat takeover needs >= 120 s
    finally:
        second.stop()
    await wait_until(lambda: owner_is_none(owner), timeout=10, message="consumer released")
    if db_kind == "postgresql":
        await wait_until(lambda: no_foreign_locks(broker), timeout=20,
                         message="no other session holding locks on the test's tables")


_HOLDING_CHILD = """
import sys, time
from sqlalchemy import update
from sqlmq.spark.options import Database
from sqlmq.spark.stream import Consumer, StreamOptions
o = StreamOptions(db=Database(sys.argv[1], sys.argv[2]), queue="jobs", consumer="held",
                  max_per_batch=10, lease=360.0, consumer_timeout=120.0, rows_per_partition=10)
Consumer(o)
t = o.db.schema.spark_consumer
hold = 1.0  # the parent's SIGTERMs land in this first transaction
while True:  # an idle stream's main thread: one short transaction after another on the row
    with o.db.sql_engine().begin() as conn:
        conn.execute(update(t).values(leased_seq=t.c.leased_seq))
        print("ready", flush=True)
        time.sleep(hold)
    hold = 0.05
    time.sleep(0.02)
"""


async def test_sigterm_inside_a_transaction_on_the_consumer_row_releases_it_and_exits(
    broker: Broker, db_url: str, prefix: str
) -> None:
    """The moment that hung CI: Spark's SIGTERMs (two of them, milliseconds apart) land
    while the driver process's main thread holds the consumer row in a transaction. The
    process must release the name and exit on its own, within seconds."""
    child = subprocess.Popen([sys.executable, "-c", _HOLDING_CHILD, db_url, prefix],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert await asyncio.to_thread(child.stdout.readline) == "ready\n"
        child.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.002)
        child.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(child.wait, 10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert code in (128 + signal.SIGTERM, -signal.SIGTERM)
    c = broker.schema.spark_consumer
    async with broker.db.connect() as conn:
        assert (await conn.execute(select(c.c.owner))).scalar_one() is None


async def owner_is_none(owner: Any) -> bool:
    return await owner() is None


async def no_foreign_locks(broker: Broker) -> bool:
    """PostgreSQL: no other session holds a lock on this test's tables (a driver process
    that survived its query would)."""
    prefix = broker.schema.message.name[: -len("message")]
    sql = text("SELECT count(*) FROM pg_locks l JOIN pg_class r ON r.oid = l.relation "
               "WHERE l.pid <> pg_backend_pid() AND r.relname LIKE :p")
    async with broker.db.connect() as conn:
        return (await conn.execute(sql, {"p": prefix + "%"})).scalar_one() == 0


async def test_replayed_streaming_batch_is_published_once(
    broker: Broker, opts: dict[str, str]
) -> None:
    """The sink's commit for a batch id it already published (Spark replays it after a
    crash) publishes nothing and drops the new staged rows."""
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    from sqlmq.spark import SqlmqDataSource
    from sqlmq.spark.sink import publish, stage

    source = SqlmqDataSource({**opts, "queue": "out", "sink": "s1"})
    schema = StructType([StructField("body", StringType())])
    batch = pa.RecordBatch.from_pydict({"body": ["a", "b"]})
    for _ in range(2):  # the original run, then the replay after a crash
        writer = source.streamWriter(schema, False)
        message = writer.write(iter([batch]))
        source.streamWriter(schema, False).commit([message], 7)
    assert [r["payload"] for r in await rows(broker, queue="out")] == [b"a", b"b"]

    # The same for a batch write inside foreachBatch, given the sink name and batch id.
    in_batch = SqlmqDataSource({**opts, "queue": "out2", "sink": "s2", "batchId": "7"})
    for _ in range(2):
        writer = in_batch.writer(schema, False)
        writer.commit([writer.write(iter([batch]))])
    assert [r["payload"] for r in await rows(broker, queue="out2")] == [b"a", b"b"]

    # publish() reports the rows it moved: all of them, then none for the replay.
    o = source.streamWriter(schema, False).options
    assert [publish(o.db, [stage(o, token, iter([batch]))], {token}, sink="s3", batch_id=1)
            for token in ("first", "replay")] == [2, 0]
    async with broker.db.connect() as conn:
        assert (await conn.execute(select(broker.schema.spark_staging))).all() == []


async def test_a_batch_takes_max_messages_per_batch_even_past_one_acquire_statement(
    broker: Broker, db_url: str, prefix: str
) -> None:
    """MariaDB's acquire statement takes at most about 3,120 ids (what fits its id list):
    a batch of 5,000 takes several statements, all in the transaction that records them."""
    await broker.publish_batch("big", [{"n": i} for i in range(5001)])
    consumer = driver_consumer(db_url, prefix, "big", 5000)
    try:
        assert consumer.lease_next(0, 5000) == (1, 5000)
        assert len(consumer.leased(0, 1)) == 5000
    finally:
        consumer.close()
    lt = broker.schema.spark_lease
    async with broker.db.connect() as conn:
        assert len((await conn.execute(select(lt.c.id).where(lt.c.seq == 1))).all()) == 5000
    assert len(await rows(broker, state="PROCESSING")) == 5000


async def test_a_stream_over_a_queue_with_channel_messages_says_it_leaves_them(
    broker: Broker, db_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The stream reads only messages published without a channel (a channel's limits are
    counted by the subscribers' acquire). A queue holding some must not look merely idle:
    a lease that finds nothing says so, once a minute at most."""
    caplog.set_level(logging.WARNING, logger="sqlmq.spark")
    await broker.publish_batch("mixed", [b"plain-1", b"plain-2"])
    for i in range(3):
        await broker.publish("mixed", f"tenant-{i}".encode(), channel=f"tenant-{i % 2}")
    consumer = driver_consumer(db_url, prefix, "mixed", 10)
    try:
        assert consumer.lease_next(0, 10) == (1, 2)
        assert not said(caplog)
        assert consumer.lease_next(1, 10) == (1, 0)
        assert consumer.lease_next(1, 10) == (1, 0)
    finally:
        consumer.close()
    (warning,) = said(caplog)
    assert "queue 'mixed' holds 3 message(s) published with a channel" in warning
    assert "wait for a subscriber" in warning


def driver_consumer(db_url: str, prefix: str, queue: str, per_batch: int) -> Any:
    """A stream driver's consumer of ``queue`` (named after it), without Spark: batches and
    partitions of ``per_batch`` messages, leases long enough for any test."""
    from sqlmq.spark.options import Database
    from sqlmq.spark.stream import Consumer, StreamOptions

    return Consumer(StreamOptions(db=Database(db_url, prefix), queue=queue, consumer=queue,
                                  max_per_batch=per_batch, lease=360.0, consumer_timeout=120.0,
                                  rows_per_partition=per_batch))


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sqlmq.spark"]
