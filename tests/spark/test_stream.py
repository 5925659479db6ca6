"""Consuming a queue as a Spark stream: each message archived exactly once, and only after
Spark committed the micro-batch that read it; restarts replay the same rows."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from sqlalchemy import select

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


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
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


async def test_replayed_streaming_batch_is_published_once(
    broker: Broker, opts: dict[str, str]
) -> None:
    """The sink's commit for a batch id it already published (Spark replays it after a
    crash) publishes nothing and drops the new staged rows."""
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    from sqlmq.spark import SqlmqDataSource

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
    async with broker.db.connect() as conn:
        assert (await conn.execute(select(broker.schema.spark_staging))).all() == []
