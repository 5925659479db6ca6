"""Batch reads and writes of the sqlmq format, on every database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType
from sqlalchemy import select

from sqlmq import Broker

from ..conftest import rows

pytestmark = pytest.mark.spark


async def test_written_rows_round_trip_every_column_through_the_queue_and_the_archive(
    spark: Any, broker: Broker, opts: dict[str, str]
) -> None:
    schema = StructType([
        StructField("payload", BinaryType()),
        StructField("queue", StringType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("key", StringType()),
    ])
    data = [
        (b'{"n":1}', "orders", {"content-type": "application/json", "tenant": "a"}, "k1"),
        (b"\x00\xffraw", "orders", {}, None),
        ("héllo".encode(), "audit", {"content-type": "text/plain; charset=utf-8"}, "k3"),
    ]
    (spark.createDataFrame(data, schema).withColumn("delay", F.lit(0.0))
     .write.format("sqlmq").options(**opts).mode("append").save())

    live = {r["payload"]: r for r in await rows(broker)}
    assert set(live) == {d[0] for d in data}
    assert live[b'{"n":1}']["headers"] == {"content-type": "application/json", "tenant": "a",
                                          "key": "k1"}
    assert live[b"\x00\xffraw"]["headers"] == {"content-type": "application/octet-stream"}

    read = spark.read.format("sqlmq").options(**opts).load().collect()
    by_payload = {bytes(r.payload): r for r in read}
    assert {p: r.queue for p, r in by_payload.items()} == {d[0]: d[1] for d in data}
    first, raw, text = (by_payload[d[0]] for d in data)
    assert {r.id for r in read} == {r["id"] for r in live.values()}
    assert first.headers == {"content-type": "application/json", "tenant": "a", "key": "k1"}
    assert first.body == '{"n":1}'
    assert raw.body is None
    assert text.body == "héllo"
    assert {r.state for r in read} == {"PENDING"}
    assert {(r.attempts, r.deliveries) for r in read} == {(0, 0)}
    db_first = live[b'{"n":1}']
    assert first.created_at.replace(tzinfo=UTC) == db_first["created_at"]
    assert first.next_attempt_at.replace(tzinfo=UTC) == db_first["next_attempt_at"]
    assert first.first_attempt_at is None and first.lease_expires_at is None
    assert first.error is None

    # Archive one message FAILED and read the archive columns back.
    (delivery,) = await broker.engine.acquire(["audit"], 1, 30)
    from sqlmq import Outcome, Settlement

    await broker.engine.settle([Settlement(delivery.id, delivery.deliveries, Outcome.FAIL,
                                           error="boom")])
    (archived,) = (spark.read.format("sqlmq").options(**opts).option("table", "archive")
                   .load().collect())
    (db_row,) = await rows(broker, "archive")
    assert archived.id == db_row["id"] and archived.state == "FAILED"
    assert archived.error == "boom" and archived.body == "héllo"
    assert (archived.attempts, archived.deliveries) == (1, 1)
    assert archived.archived_at.replace(tzinfo=UTC) == db_row["archived_at"]
    assert archived.first_attempt_at.replace(tzinfo=UTC) == db_row["first_attempt_at"]


async def test_parallel_batch_read_equals_a_direct_sql_read_with_filters_pushed_down(
    spark: Any, broker: Broker, opts: dict[str, str]
) -> None:
    for i in range(6):
        await broker.publish_batch("a" if i % 2 else "b", [{"i": i, "j": j} for j in range(500)],
                                   delay=3600 if i == 5 else None)
    df = spark.read.format("sqlmq").options(**opts).option("numPartitions", 4).load()
    assert df.rdd.getNumPartitions() == 4
    got = sorted((r.id, r.queue, r.payload, r.next_attempt_at) for r in df.collect())
    expected = sorted(
        (r["id"], r["queue"], r["payload"], r["next_attempt_at"].replace(tzinfo=None))
        for r in await rows(broker)
    )
    assert got == expected

    cutoff = datetime.now(UTC) + timedelta(minutes=30)
    filtered = df.where((F.col("queue") == "a") & (F.col("next_attempt_at") > cutoff))
    plan = filtered._jdf.queryExecution().optimizedPlan().toString()
    assert "Filter" not in plan  # queue and time were pushed into SQL
    assert sorted(r.id for r in filtered.collect()) == [
        r["id"] for r in await rows(broker, queue="a") if r["next_attempt_at"] > cutoff
    ]


async def test_failed_write_job_publishes_nothing_and_leaves_no_staged_rows(
    spark: Any, broker: Broker, opts: dict[str, str]
) -> None:
    good = [(f"m{i}", "orders") for i in range(200)]
    bad = [("x", "")]  # an empty queue name fails its task after the others staged rows
    df = spark.createDataFrame(good + bad, "body string, queue string").repartition(2)
    with pytest.raises(Exception, match="queue name must not be empty"):
        df.write.format("sqlmq").options(**opts).mode("append").save()
    assert await rows(broker) == []
    async with broker.db.connect() as conn:
        staged = (await conn.execute(select(broker.schema.spark_staging))).all()
    assert staged == []


async def test_bad_options_fail_with_a_clear_error_before_any_job_runs(
    spark: Any, broker: Broker, opts: dict[str, str]
) -> None:
    await broker.publish("orders", "x")
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()

    def load(**extra: str) -> Any:
        return spark.read.format("sqlmq").options(**extra).load()

    with pytest.raises(Exception, match="needs option 'url'"):
        load()
    with pytest.raises(Exception, match="unknown table 'mesages'"):
        load(**opts, table="mesages")
    with pytest.raises(Exception, match=r"unknown queue 'ordres'.*queues there: orders"):
        load(**opts, queue="ordres").collect()
    with pytest.raises(Exception, match="no sqlmq tables"):
        load(**{**opts, "prefix": "nosuch_"})
    wrong = spark.createDataFrame([(1, "orders")], "payload int, queue string")
    with pytest.raises(Exception, match="column 'payload' must be binary, got int"):
        wrong.write.format("sqlmq").options(**opts).mode("append").save()
    headers = spark.createDataFrame([("x", json.dumps({}))], "body string, headers string")
    with pytest.raises(Exception, match="column 'headers' must be map<string,string>"):
        headers.write.format("sqlmq").options(**opts, queue="q").mode("append").save()
    with pytest.raises(Exception, match="needs option 'consumer'"):
        spark.readStream.format("sqlmq").options(**opts, queue="orders").load() \
            .writeStream.format("noop").start().awaitTermination(60)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs
