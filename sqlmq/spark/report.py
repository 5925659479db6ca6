"""``sqlmq report``: analytics of the archive as a Spark job.

Per queue: throughput over time, end-to-end latency percentiles (created -> archived),
failure and retry rates, and the most frequent errors. Writes Parquet tables and a PNG
chart under ``--out`` and prints a short table. Runs on ``local[*]`` by default; under
``spark-submit --master ...`` the same code runs on the cluster's master (the executors
need sqlmq and its drivers installed, e.g. ``--py-files`` or an image with ``sqlmq[spark]``)::

    sqlmq report --url postgresql://app@db/app --out report/ --bucket "5 minutes"
    spark-submit --master spark://host:7077 "$(python -c 'import sqlmq.spark.report as r;
        print(r.__file__)')" --url postgresql://app@db/app
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Absolute imports: spark-submit runs this file as a script.
from sqlmq.connect import safe_url
from sqlmq.errors import SqlmqError
from sqlmq.lifecycle import State
from sqlmq.schema import DEFAULT_PREFIX

PERCENTILES = (0.5, 0.9, 0.99)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sqlmq report",
        description="Archive analytics on Spark: throughput, latency, failures, top errors.",
    )
    p.add_argument("--url", required=True, help="database URL (postgresql://, mysql://, ...)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="table prefix (default sqlmq_)")
    p.add_argument("--out", default="sqlmq-report", help="output directory (Parquet + PNG)")
    p.add_argument("--bucket", default="auto",
                   help="throughput time bucket, a Spark interval such as '10 seconds' "
                        "(default: about 60 buckets over the archive's time span)")
    p.add_argument("--since", help="only messages archived at or after this ISO time (UTC)")
    p.add_argument("--queue", action="append", help="only these queues (repeatable)")
    p.add_argument("--top", type=int, default=5, help="errors listed per queue (default 5)")
    p.add_argument("--master", help="Spark master (default local[*], or spark-submit's)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    since = None
    if args.since:
        try:
            since = datetime.fromisoformat(args.since)
        except ValueError:
            print(f"sqlmq report: --since {args.since!r} is not an ISO date/time", file=sys.stderr)
            return 2
        since = since if since.tzinfo else since.replace(tzinfo=UTC)
    try:
        spark = session(args.master)
    except ImportError:
        print("sqlmq report needs pyspark: pip install 'sqlmq[spark]'", file=sys.stderr)
        return 2
    try:
        tables = analyse(spark, args.url, args.prefix, args.bucket, since, args.queue, args.top)
    except SqlmqError as exc:
        print(f"sqlmq report: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # Spark wraps the source's errors; show their message
        text = str(exc)
        marker = "sqlmq.errors."
        if marker in text:
            print(f"sqlmq report: {text[text.rindex(marker) + len(marker):].strip()}",
                  file=sys.stderr)
            return 2
        raise
    if tables is None:
        print(f"sqlmq report: no archived messages in {safe_url(args.url)} "
              f"(prefix {args.prefix}) for this selection")
        return 0
    out = Path(args.out)
    write(tables, out)
    print_table(tables["summary"])
    print(f"\nwrote {out}/summary, {out}/throughput, {out}/errors (Parquet) and "
          f"{out}/report.png")
    return 0


def session(master: str | None) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from sqlmq.spark import register

    builder = SparkSession.builder.appName("sqlmq-report")
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        builder = builder.master("local[*]")
    builder = builder.config("spark.sql.session.timeZone", "UTC").config(
        "spark.sql.python.filterPushdown.enabled", "true")
    spark = builder.getOrCreate()
    register(spark)
    return spark


def analyse(spark: Any, url: str, prefix: str, bucket: str, since: datetime | None,
            queues: list[str] | None, top: int) -> dict[str, Any] | None:
    """The report's three tables as Spark DataFrames (None when nothing matches)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = (spark.read.format("sqlmq").option("url", url).option("prefix", prefix)
          .option("table", "archive").load())
    if since is not None:
        df = df.where(F.col("archived_at") >= F.lit(since))
    if queues:
        df = df.where(F.col("queue").isin(queues))
    df = df.select(
        "queue", "state", "attempts", "deliveries", "error", "archived_at",
        ((F.unix_micros("archived_at") - F.unix_micros("created_at")) / 1e6).alias("latency_s"),
    ).cache()
    if df.isEmpty():
        return None
    if bucket == "auto":
        first, last = df.agg(F.min("archived_at"), F.max("archived_at")).first()
        bucket = auto_bucket((last - first).total_seconds())

    failed = F.col("state") == State.FAILED.value
    summary = df.groupBy("queue").agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum((~failed).cast("long")).alias("completed"),
        F.sum(failed.cast("long")).alias("failed"),
        F.avg(failed.cast("double")).alias("failure_rate"),
        F.avg((F.col("attempts") > 1).cast("double")).alias("retry_rate"),
        F.avg(F.greatest(F.col("attempts") - 1, F.lit(0))).alias("retries_per_message"),
        F.percentile_approx("latency_s", list(PERCENTILES), 10_000).alias("p"),
        F.max("latency_s").alias("latency_max_s"),
        F.min("archived_at").alias("first_archived_at"),
        F.max("archived_at").alias("last_archived_at"),
    )
    span = F.greatest(
        F.unix_micros("last_archived_at") - F.unix_micros("first_archived_at"), F.lit(1_000_000))
    summary = summary.select(
        "queue", "messages", "completed", "failed", "failure_rate", "retry_rate",
        "retries_per_message",
        *(F.col("p")[i].alias(f"latency_p{int(q * 100)}_s") for i, q in enumerate(PERCENTILES)),
        "latency_max_s", "first_archived_at", "last_archived_at",
        (F.col("messages") / (span / 1e6)).alias("messages_per_s"),
    ).orderBy("queue")

    throughput = (
        df.groupBy("queue", F.window("archived_at", bucket).alias("w"))
        .agg(F.count(F.lit(1)).alias("messages"), F.sum(failed.cast("long")).alias("failed"),
             F.avg("latency_s").alias("latency_avg_s"))
        .select("queue", F.col("w.start").alias("bucket_start"), F.col("w.end").alias("bucket_end"),
                "messages", "failed", "latency_avg_s")
        .orderBy("queue", "bucket_start")
    )

    ranked = Window.partitionBy("queue").orderBy(F.desc("messages"), "error")
    errors = (
        df.where(F.col("error").isNotNull())
        .groupBy("queue", F.substring("error", 1, 300).alias("error"))
        .agg(F.count(F.lit(1)).alias("messages"), F.sum(failed.cast("long")).alias("failed"))
        .withColumn("rank", F.row_number().over(ranked))
        .where(F.col("rank") <= top)
        .orderBy("queue", "rank")
    )
    return {"summary": summary, "throughput": throughput, "errors": errors}


def write(tables: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        df.coalesce(1).write.mode("overwrite").parquet(str(out / name))
    chart(tables["throughput"].collect(), tables["summary"].collect(), out / "report.png")


#: Round bucket sizes, in seconds, that ``auto`` chooses from.
_BUCKETS = [(1, "1 second"), (5, "5 seconds"), (10, "10 seconds"), (30, "30 seconds"),
            (60, "1 minute"), (300, "5 minutes"), (900, "15 minutes"), (3600, "1 hour"),
            (21600, "6 hours"), (86400, "1 day")]


def auto_bucket(span_seconds: float) -> str:
    """The smallest round bucket that puts at most about 60 buckets over ``span_seconds``."""
    for seconds, name in _BUCKETS:
        if span_seconds / seconds <= 60:
            return name
    return _BUCKETS[-1][1]


def chart(throughput: list[Any], summary: list[Any], path: Path) -> None:
    """Throughput per queue over time above, latency percentiles per queue below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8))
    for queue in sorted({r.queue for r in throughput}):
        rows = [r for r in throughput if r.queue == queue]
        rates = [r.messages / max((r.bucket_end - r.bucket_start).total_seconds(), 1e-9)
                 for r in rows]
        top.plot([r.bucket_start for r in rows], rates, marker=".", label=queue)
    if throughput:  # pad by one bucket each side: a single bucket otherwise spans years
        width = max(r.bucket_end - r.bucket_start for r in throughput)
        top.set_xlim(min(r.bucket_start for r in throughput) - width,
                     max(r.bucket_end for r in throughput) + width)
    locator = mdates.AutoDateLocator()
    top.xaxis.set_major_locator(locator)
    top.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    top.set_title("Throughput (archived messages per second, UTC)")
    top.set_ylabel("msg/s")
    top.legend(loc="upper right", fontsize="small")
    width = 0.25
    xs = list(range(len(summary)))
    for i, q in enumerate(PERCENTILES):
        column = f"latency_p{int(q * 100)}_s"
        bottom.bar([x + (i - 1) * width for x in xs], [r[column] for r in summary], width,
                   label=f"p{int(q * 100)}")
    bottom.set_xticks(xs, [r.queue for r in summary], rotation=30, ha="right")
    bottom.set_title("End-to-end latency, created -> archived")
    bottom.set_ylabel("seconds")
    bottom.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_table(summary: Any) -> None:
    rows = summary.collect()
    head = ("queue", "messages", "failed %", "retried %", "p50 s", "p90 s", "p99 s", "msg/s")
    lines = [head] + [
        (r.queue, str(r.messages), f"{100 * r.failure_rate:.1f}", f"{100 * r.retry_rate:.1f}",
         f"{r.latency_p50_s:.3f}", f"{r.latency_p90_s:.3f}", f"{r.latency_p99_s:.3f}",
         f"{r.messages_per_s:.1f}")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for n, line in enumerate(lines):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(line, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
