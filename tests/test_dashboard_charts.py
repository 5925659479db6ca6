"""The dashboard's charts: what ``Insights.throughput_by_queue`` counts (on every engine),
and what the overview draws from it over HTTP: a chart of every queue's completions and
failures per minute over the last hour, and a sparkline per queue, all from one read
of the archive whatever the number of queues. The charts drawing in a browser, legends
included, is the browser test of tests/test_search.py."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from itertools import pairwise

import httpx
import pytest
from sqlalchemy import event, update

from sqlmq import Broker, Outcome, Settlement
from sqlmq.dashboard import create_app
from sqlmq.dashboard.charts import SPARK_HEIGHT, SPARK_WIDTH, sparkline
from sqlmq.engines.memory.engine import MemoryEngine

from .conftest import on_every_engine


async def _archive(broker: Broker, queue: str, outcome: Outcome, n: int = 1) -> list[int]:
    await broker.publish_batch(queue, [{"n": i} for i in range(n)])
    taken = await broker.engine.acquire([queue], n, 30)
    assert len(taken) == n
    await broker.engine.settle([Settlement(d.id, d.deliveries, outcome,
                                           error=None if outcome is Outcome.COMPLETE else "x")
                                for d in taken])
    return [d.id for d in taken]


async def _backdate(broker: Broker, msg_id: int, seconds: float) -> None:
    """Move an archived message's archive time ``seconds`` back, as if it ended then."""
    engine = broker.engine
    if isinstance(engine, MemoryEngine):
        with engine._lock:
            row = engine._store.archive[msg_id]
            row.archived_at -= timedelta(seconds=seconds)
        return
    archive = broker.schema.archive
    async with broker.db.begin() as conn:
        row = (await conn.execute(archive.select().where(archive.c.id == msg_id))).one()
        await conn.execute(update(archive).where(archive.c.id == msg_id).values(
            archived_at=row.archived_at - timedelta(seconds=seconds)))


@on_every_engine
async def test_throughput_by_queue_counts_each_minute_of_the_hour(broker: Broker) -> None:
    await _archive(broker, "orders", Outcome.COMPLETE)
    (earlier,) = await _archive(broker, "orders", Outcome.COMPLETE)
    (too_old,) = await _archive(broker, "orders", Outcome.COMPLETE)
    (failed,) = await _archive(broker, "emails", Outcome.FAIL)
    await _backdate(broker, earlier, 10.5 * 60)
    await _backdate(broker, too_old, 70 * 60)
    await _backdate(broker, failed, 30.5 * 60)
    insights = broker.insights()

    found = await insights.throughput_by_queue(["orders", "emails", "idle"], span=3600,
                                               step=60)
    assert sorted(found) == ["emails", "idle", "orders"]
    orders, emails, idle = found["orders"], found["emails"], found["idle"]
    assert len(orders) == len(emails) == len(idle) == 60
    assert [k for k, b in enumerate(orders) if b.completed] == [49, 59]  # oldest first
    assert sum(b.completed for b in orders) == 2 and not any(b.failed for b in orders)
    assert [(k, b.failed) for k, b in enumerate(emails) if b.failed] == [(29, 1)]
    assert not any(b.completed or b.failed for b in idle)
    for buckets in found.values():
        assert all((b.end - b.start) == timedelta(seconds=60) for b in buckets)
        assert all(a.end == b.start for a, b in pairwise(buckets))
    assert orders[-1].end == emails[-1].end == idle[-1].end

    assert sorted(await insights.throughput_by_queue()) == ["emails", "orders"]
    two_minutes = await insights.throughput("orders", span=3600, step=120)
    assert len(two_minutes) == 30
    assert [k for k, b in enumerate(two_minutes) if b.completed] == [24, 29]
    with pytest.raises(ValueError, match="1 to 120 buckets"):
        await insights.throughput_by_queue(span=3600, step=1)


def test_a_sparkline_scales_to_its_peak_with_the_newest_at_the_right() -> None:
    line = sparkline([0, 2, 4, 1])
    points = [tuple(map(float, p.split(","))) for p in line.points.split()]
    assert [x for x, _ in points] == [0.0, 40.0, 80.0, 120.0]
    assert points[2][1] == 1.0 and points[0][1] == SPARK_HEIGHT - 1  # the peak at the top
    assert (line.latest, line.peak, line.total) == (1, 4, 7)
    assert line.view_box == f"0 0 {SPARK_WIDTH:g} {SPARK_HEIGHT:g}"
    flat = sparkline([0] * 60)
    assert {p.split(",")[1] for p in flat.points.split()} == {f"{SPARK_HEIGHT - 1:.1f}"}


def _sparkline_of(page: str, queue: str) -> list[tuple[float, float]]:
    row = re.search(rf'<tr data-queue="{re.escape(html.escape(queue))}">(.*?)</tr>', page,
                    re.S)
    assert row, f"no row for {queue!r}"
    found = re.search(r'data-col="spark".*?<polyline class="line" points="([^"]+)"',
                      row.group(1), re.S)
    assert found, f"no sparkline in the row of {queue!r}"
    return [tuple(map(float, p.split(","))) for p in found.group(1).split()]


def _chart_of(page: str) -> dict[str, list[float]]:
    found = re.search(r"data-throughput='([^']+)'", page)
    assert found, "no overview chart figures in the page"
    return json.loads(html.unescape(found.group(1)))


@contextmanager
def _statements(broker: Broker) -> Iterator[list[str]]:
    sent: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        sent.append(statement)

    event.listen(broker.db.sync_engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(broker.db.sync_engine, "before_cursor_execute", record)


async def test_the_overview_draws_every_queue_per_minute_from_one_read(
        broker: Broker) -> None:
    await _archive(broker, "orders", Outcome.COMPLETE, 3)
    await _archive(broker, "orders", Outcome.FAIL)
    (old,) = await _archive(broker, "emails", Outcome.COMPLETE)
    await _backdate(broker, old, 20.5 * 60)
    await broker.publish("idle", {"waiting": True})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(broker)),
                                 base_url="http://127.0.0.1") as client:
        page = (await client.get("/")).text
        assert 'data-keep="overview-chart"' in page and 'data-chart="overview"' in page
        chart = _chart_of(page)
        assert len(chart["t"]) == len(chart["completed"]) == len(chart["failed"]) == 60
        assert chart["completed"][-1] == 3 and chart["failed"][-1] == 1  # per minute
        assert chart["completed"][39] == 1 and sum(chart["completed"]) == 4
        assert chart["t"] == sorted(chart["t"]) and chart["t"][1] - chart["t"][0] == 60

        orders, emails, idle = (_sparkline_of(page, q) for q in ("orders", "emails", "idle"))
        assert len(orders) == len(emails) == len(idle) == 60
        assert orders[-1] == (SPARK_WIDTH, 1.0)  # the newest minute is its peak
        assert emails[39][1] == 1.0 and emails[-1][1] == SPARK_HEIGHT - 1
        assert {y for _, y in idle} == {SPARK_HEIGHT - 1}  # nothing archived: flat
        assert "3 in the last minute, 3 at most, 3 in all" in page

        fragment = (await client.get("/partials/overview")).text
        refreshed = _chart_of(fragment)  # what the page's chart is updated with
        assert (refreshed["completed"], refreshed["failed"]) == (chart["completed"],
                                                                 chart["failed"])
        assert _sparkline_of(fragment, "orders") == orders

        # more queues cost the page no read more than they cost insights().queues()
        async def count(path_or_call: str | None) -> int:
            with _statements(broker) as sent:
                if path_or_call is None:
                    await broker.insights().queues()
                else:
                    assert (await client.get(path_or_call)).status_code == 200
            return len(sent)

        before = (await count("/partials/overview"), await count(None))
        for i in range(4):
            await _archive(broker, f"more-{i}", Outcome.COMPLETE)
        after = (await count("/partials/overview"), await count(None))
        assert after[0] - before[0] == after[1] - before[1]
