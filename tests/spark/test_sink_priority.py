"""The sink's ``priority`` column, without a Spark job: staged rows (binary COPY on
PostgreSQL) are published with their priority (null or no column: 0), taken in priority
order; an out-of-range priority fails the task; a non-integer column is refused up front."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StructField,
    StructType,
)

from sqlmq import Broker
from sqlmq.errors import ConfigurationError, PublishError
from sqlmq.spark.options import Database, Options
from sqlmq.spark.sink import SinkOptions, publish, sink_options, stage

from ..conftest import rows

pytestmark = pytest.mark.spark


def _options(opts: dict[str, str]) -> SinkOptions:
    return SinkOptions(db=Database(opts["url"], opts["prefix"]), queue="orders",
                       columns=("payload", "priority"),
                       content_type="application/octet-stream", max_payload_bytes=1 << 20,
                       sink=None)


def _batch(payloads: list[bytes], priorities: list[int | None] | None) -> Any:
    columns = {"payload": pa.array(payloads, pa.binary())}
    if priorities is not None:
        columns["priority"] = pa.array(priorities, pa.int32())
    return pa.record_batch(columns)


async def test_staged_rows_are_published_with_their_priority(
    broker: Broker, opts: dict[str, str]
) -> None:
    o = _options(opts)
    token = uuid.uuid4().hex
    staged = [stage(o, token, iter([_batch([b"a", b"b", b"c", b"d"], [0, 7, None, -32768])])),
              stage(o, token, iter([_batch([b"e"], None)])),
              stage(o, token, iter([_batch([b"f"], [32767])]))]
    assert publish(o.db, staged, {token}) == 6
    assert [(r["payload"], r["priority"]) for r in await rows(broker)] == [
        (b"a", 0), (b"b", 7), (b"c", 0), (b"d", -32768), (b"e", 0), (b"f", 32767)]
    taken = await broker.engine.acquire(["orders"], 10, 30)
    assert [d.payload for d in taken] == [b"f", b"b", b"a", b"c", b"e", b"d"]


async def test_a_priority_out_of_range_fails_the_task(broker: Broker,
                                                      opts: dict[str, str]) -> None:
    o = _options(opts)
    batch = pa.record_batch({"payload": pa.array([b"a", b"b"], pa.binary()),
                             "priority": pa.array([1, 40000], pa.int64())})
    with pytest.raises(PublishError, match="row 1: priority must be from -32768 to 32767"):
        stage(o, uuid.uuid4().hex, iter([batch]))
    assert await rows(broker) == []


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_the_priority_column_must_be_an_integer(broker: Broker,
                                                      opts: dict[str, str]) -> None:
    options = Options({"url": opts["url"], "prefix": opts["prefix"], "queue": "orders"},
                      "the sqlmq sink")
    for kind in (IntegerType(), LongType()):
        schema = StructType([StructField("payload", BinaryType()),
                             StructField("priority", kind)])
        assert sink_options(options, schema, overwrite=False).columns == ("payload", "priority")
    schema = StructType([StructField("payload", BinaryType()),
                         StructField("priority", DoubleType())])
    with pytest.raises(ConfigurationError, match="column 'priority' must be an integer"):
        sink_options(options, schema, overwrite=False)


async def test_a_spark_write_publishes_the_priority_column(
    spark: Any, broker: Broker, opts: dict[str, str]
) -> None:
    from pyspark.sql import functions as F

    df = spark.createDataFrame([("low",), ("high",), ("none",)], "body string").withColumn(
        "priority", F.when(F.col("body") == "high", F.lit(5))
        .when(F.col("body") == "low", F.lit(-1)).otherwise(F.lit(None)).cast("int"))
    df.write.format("sqlmq").options(**opts).option("queue", "jobs").mode("append").save()
    assert {r["payload"]: r["priority"] for r in await rows(broker)} == {
        b"low": -1, b"high": 5, b"none": 0}
    taken = await broker.engine.acquire(["jobs"], 10, 30)
    assert [d.payload for d in taken] == [b"high", b"none", b"low"]
