"""``sqlmq report``: archive analytics as a Spark job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sqlmq import Broker, Outcome, Settlement
from sqlmq.spark.report import main

pytestmark = pytest.mark.spark


async def settle_all(broker: Broker, queue: str, outcome: Outcome, n: int,
                     error: str | None = None) -> None:
    got = await broker.engine.acquire([queue], n, 30)
    assert len(got) == n
    await broker.engine.settle([Settlement(d.id, d.deliveries, outcome, error=error)
                                for d in got])


async def test_report_writes_rates_latency_and_top_errors_per_queue(
    spark: Any, broker: Broker, opts: dict[str, str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await broker.publish_batch("a", list(range(10)))
    await broker.publish_batch("b", list(range(5)))
    await settle_all(broker, "a", Outcome.COMPLETE, 7)
    await settle_all(broker, "a", Outcome.FAIL, 2, error="ValueError: boom")
    await settle_all(broker, "a", Outcome.FAIL, 1, error="KeyError: x")
    await settle_all(broker, "b", Outcome.RETRY, 1, error="TimeoutError")
    await settle_all(broker, "b", Outcome.COMPLETE, 5)
    out = tmp_path / "report"

    code = main(["--url", opts["url"], "--prefix", opts["prefix"], "--out", str(out),
                 "--bucket", "10 seconds"])

    assert code == 0
    summary = {r.queue: r for r in spark.read.parquet(str(out / "summary")).collect()}
    assert (summary["a"].messages, summary["a"].failed) == (10, 3)
    assert summary["a"].failure_rate == pytest.approx(0.3)
    assert summary["b"].retry_rate == pytest.approx(0.2)
    assert summary["b"].latency_p50_s <= summary["b"].latency_p99_s
    assert summary["b"].latency_p99_s >= 0
    throughput = spark.read.parquet(str(out / "throughput")).collect()
    assert sum(r.messages for r in throughput if r.queue == "a") == 10
    errors = [(r.queue, r.error, r.messages, r.rank)
              for r in spark.read.parquet(str(out / "errors")).orderBy("queue", "rank").collect()]
    assert errors[:2] == [("a", "ValueError: boom", 2, 1), ("a", "KeyError: x", 1, 2)]
    assert (out / "report.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "p99 s" in printed and "\na " in printed


def test_report_with_a_bad_url_explains_itself_and_exits_2(
    spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", "oracle://x/y"]) == 2
    assert "unsupported database 'oracle'" in capsys.readouterr().err


@pytest.mark.spark
def test_auto_bucket_puts_about_sixty_round_buckets_over_the_span() -> None:
    from sqlmq.spark.report import auto_bucket

    assert auto_bucket(0) == "1 second"
    assert auto_bucket(30) == "1 second"
    assert auto_bucket(61) == "5 seconds"
    assert auto_bucket(600) == "10 seconds"
    assert auto_bucket(3 * 3600) == "5 minutes"
    assert auto_bucket(400 * 86400) == "1 day"
