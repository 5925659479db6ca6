"""Spark figures for sqlmq: session start, sink publish rate, stream consumption rate and
the per-micro-batch overhead, at local[2] on PostgreSQL (or any sqlmq URL).

    .venv/bin/python bench/spark_rates.py [--url postgresql://postgres@127.0.0.1:5432/test]
        [--messages 200000] [--batch 50000] [--sink-only] [--rounds 1]

Each run uses its own table prefix and drops its tables afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from datetime import datetime

from sqlalchemy import create_engine

from sqlmq import Broker, build_schema
from sqlmq.connect import parse_url, sync_url

_loop = asyncio.new_event_loop()  # one loop: the broker's engine is bound to it


def wait(coro: object) -> object:
    return _loop.run_until_complete(coro)  # type: ignore[arg-type]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default=os.environ.get(
        "SQLMQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=50_000, help="maxMessagesPerBatch")
    p.add_argument("--rows-per-partition", type=int, default=None,
                   help="rowsPerPartition of the stream (default: the source's)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--sink-only", action="store_true",
                   help="measure only the sink's publish rate (no stream, no per-batch figures)")
    p.add_argument("--rounds", type=int, default=1,
                   help="sink writes of --messages each, in one session (median reported)")
    args = p.parse_args()
    prefix = f"b{uuid.uuid4().hex[:8]}_"
    broker = Broker(args.url, table_prefix=prefix)
    wait(broker.migrate())
    opts = {"url": args.url, "prefix": prefix}
    try:
        run(args, broker, opts)
    finally:
        wait(broker.close())
        engine = create_engine(sync_url(parse_url(args.url)))
        build_schema(prefix).metadata.drop_all(engine)
        engine.dispose()
    return 0


def run(args: argparse.Namespace, broker: Broker, opts: dict[str, str]) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Spark's Python workers compile pyspark/pyarrow on every start without bytecode
    # caches: let them cache (outside the source tree).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ.setdefault("PYTHONPYCACHEPREFIX", "/tmp/sqlmq-spark-pycache")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from sqlmq.spark import register

    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"database: {broker.url}  master: {args.master}  messages: {args.messages}")
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    t0 = time.perf_counter()
    spark = (
        SparkSession.builder.master(args.master).appName("sqlmq-bench")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    start = time.perf_counter() - t0
    n = args.messages

    def frame(rows: int, queue: str) -> object:
        return spark.range(rows).select(
            F.to_json(F.struct(F.col("id").alias("n"), F.lit("x" * 60).alias("pad"))).alias("body"),
            F.lit(queue).alias("queue"),
        ).repartition(2)

    frame(1000, "warm").write.format("sqlmq").options(**opts).mode("append").save()
    df = frame(n, "bench").cache()
    df.count()
    print(f"session start:          {start:8.2f} s", flush=True)
    rates = []
    for _ in range(max(1, args.rounds)):
        t = time.perf_counter()
        df.write.format("sqlmq").options(**opts, contentType="application/json") \
            .mode("append").save()
        publish = time.perf_counter() - t
        rates.append(n / publish)
        print(f"sink publish rate:      {n / publish:10,.0f} msg/s  ({publish:.2f} s for {n})",
              flush=True)
    if len(rates) > 1:
        print(f"sink publish median:    {sorted(rates)[len(rates) // 2]:10,.0f} msg/s  "
              f"(min {min(rates):,.0f}, max {max(rates):,.0f}, {len(rates)} rounds)", flush=True)
    if args.sink_only:
        spark.stop()
        return

    stream_opts = {"queue": "bench", "consumer": "bench", "maxMessagesPerBatch": args.batch}
    if args.rows_per_partition:
        stream_opts["rowsPerPartition"] = args.rows_per_partition
    with tempfile.TemporaryDirectory() as ck:
        t = time.perf_counter()
        started = time.time()
        q = (spark.readStream.format("sqlmq").options(**opts).options(**stream_opts).load()
             .writeStream.format("noop").option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        consume = time.perf_counter() - t
        batches = [x for x in q.recentProgress if x["numInputRows"]]
    remaining = sum(s.pending + s.processing for s in wait(broker.stats())  # type: ignore
                    if s.queue == "bench")
    total = n * max(1, args.rounds)
    print(f"\nstream consumption:     {total / consume:10,.0f} msg/s  ({consume:.2f} s from "
          f"start() to the end, {len(batches)} batches of <= {args.batch}, acked; "
          f"{remaining} left in queue)", flush=True)
    # Without the query's start and its first batch (Python workers and the source's
    # process starting, connections opening): the rate a running stream keeps up.
    if batches:
        first = datetime.fromisoformat(batches[0]["timestamp"].replace("Z", "+00:00"))
        print(f"stream, query start:    {first.timestamp() - started:8.2f} s (start() to the "
              "first micro-batch)", flush=True)
    later = batches[1:]
    if later:
        busy = sum(x["durationMs"]["triggerExecution"] for x in later) / 1000
        rows = sum(x["numInputRows"] for x in later)
        print(f"stream, running:        {rows / busy:10,.0f} msg/s  ({rows} rows of batches "
              f"1-{len(batches) - 1} in {busy:.2f} s of trigger execution)", flush=True)
    for x in batches:
        d = x["durationMs"]
        print(f"  batch {x['batchId']}: {x['numInputRows']} rows, "
              + ", ".join(f"{k} {v / 1000:.2f}s" for k, v in sorted(d.items())), flush=True)

    small = 10
    wait(broker.publish_batch("tiny", list(range(small))))
    with tempfile.TemporaryDirectory() as ck:
        q = (spark.readStream.format("sqlmq").options(**opts)
             .options(queue="tiny", consumer="tiny", maxMessagesPerBatch=1).load()
             .writeStream.format("noop").option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        tiny = [x for x in q.recentProgress if x["numInputRows"]]
    per_batch = sorted(x["durationMs"]["triggerExecution"] for x in tiny)

    print(f"per-batch overhead:     {per_batch[len(per_batch) // 2] / 1000:8.2f} s median "
          f"(1-message batches, {len(tiny)} of them, min {per_batch[0] / 1000:.2f} s)")
    print("load average at end:   {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    spark.stop()


if __name__ == "__main__":
    sys.exit(main())
