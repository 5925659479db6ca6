"""The read-only insights layer on every engine: counts, rates over windows, latency,
messages by id (live, archived, binary, malformed) and the archive searched by key."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from sqlmq import ArchiveQuery, Broker, Outcome, Settlement, serve_metrics

from .conftest import on_every_engine, run_cli, update_row


async def _settle(broker: Broker, queue: str, outcomes: list[Outcome],
                  error: str = "boom") -> list[int]:
    taken = await broker.engine.acquire([queue], len(outcomes), 30)
    assert len(taken) == len(outcomes)
    written = await broker.engine.settle([
        Settlement(d.id, d.deliveries, o, error=None if o is Outcome.COMPLETE else error,
                   delay=0.0)
        for d, o in zip(taken, outcomes, strict=True)])
    assert written == {d.id for d in taken}
    return [d.id for d in taken]


@on_every_engine
async def test_queue_overview_counts_rates_and_latency(broker: Broker) -> None:
    for n in range(6):
        await broker.publish("orders", {"n": n})
    await broker.publish("refunds", {"n": 0})
    await _settle(broker, "orders", [Outcome.COMPLETE] * 3 + [Outcome.FAIL])
    (retried,) = await _settle(broker, "orders", [Outcome.RETRY])
    (again,) = await broker.engine.acquire(["orders"], 1, 30)  # its second delivery ...
    if again.id != retried:  # ... or the sixth message, ready first: complete it too
        await broker.engine.settle([Settlement(again.id, again.deliveries, Outcome.COMPLETE)])
        (again,) = await broker.engine.acquire(["orders"], 1, 30)
    assert again.id == retried and again.deliveries == 2
    await broker.engine.settle([Settlement(again.id, 2, Outcome.COMPLETE)])

    overview = {q.queue: q for q in await broker.insights().queues()}
    orders = overview["orders"]
    assert (orders.stats.completed, orders.stats.failed, orders.stats.pending) == (5, 1, 0)
    for window in ("1m", "15m", "1h"):
        w = orders.activity[window]
        assert (w.completed, w.failed, w.cancelled, w.expired, w.retried) == (5, 1, 0, 0, 1)
    assert orders.rate("1m") == pytest.approx(5 / 60)
    assert orders.latency is not None and orders.latency.count == 5
    assert 0 <= orders.latency.p50 <= orders.latency.p99 <= orders.latency.max
    assert orders.oldest_ready_age is None  # nothing waits

    refunds = overview["refunds"]
    assert refunds.stats.pending == 1 and refunds.latency is None
    assert refunds.activity["1h"].completed == 0
    assert refunds.oldest_ready_age is not None and refunds.oldest_ready_age >= 0

    detail = await broker.insights().queue("refunds")
    assert detail is not None and detail.deliveries == {0: 1}
    assert await broker.insights().queue("nothing-here") is None


@on_every_engine
async def test_channel_messages_count_in_the_oldest_ready_age(broker: Broker, db_kind: str,
                                                              db_url: str, prefix: str) -> None:
    """A channel's waiting message is ready as a plain one is (it waits with its due time
    in ``channel_due_at``, not ``next_attempt_at``): the overview (``sqlmq queues``, the
    dashboard) and the Prometheus gauge count it, one held back only by its channel's
    max_concurrency too; one delayed into the future is not ready yet."""
    await broker.set_channel("one", max_concurrency=1)
    running, held = await broker.publish_batch("limited", [1, 2], channel="one")
    assert [d.id for d in await broker.engine.acquire(["limited"], 2, 30)] == [running]
    plain = await broker.publish("mixed", {"n": 1})
    fair = await broker.publish("mixed", {"n": 2}, channel="tenant-a")
    await broker.publish("later", {"n": 3}, channel="tenant-a", delay=3600)
    now = await broker.engine.now()
    await update_row(broker, held, channel_due_at=now - timedelta(minutes=2))
    await update_row(broker, fair, channel_due_at=now - timedelta(minutes=1))
    await update_row(broker, plain, next_attempt_at=now - timedelta(seconds=30))

    ages = {q.queue: q.oldest_ready_age for q in await broker.insights().queues()}
    assert ages["later"] is None
    assert ages["limited"] is not None and 120 <= ages["limited"] < 180, ages
    assert ages["mixed"] is not None and 60 <= ages["mixed"] < 120, ages  # not the plain one
    stats = {s.queue: s for s in await broker.stats()}
    assert stats["limited"].oldest_ready_at == now - timedelta(minutes=2)
    if db_kind != "memory":
        shown = json.loads((await asyncio.to_thread(
            run_cli, "queues", "--json", "--url", db_url, "--prefix", prefix)).stdout)
        assert {q["queue"]: q["oldest_ready_age"] is not None for q in shown} == {
            "limited": True, "mixed": True, "later": False}

    metrics = serve_metrics(broker, 0, queue_depth=True, queue_depth_interval=0)
    await broker.start()
    try:
        assert metrics.port is not None
        text = await asyncio.to_thread(_scrape, metrics.port)
        seconds = {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("sqlmq_queue_oldest_ready_seconds{")}
        assert seconds["limited"] >= 120 and seconds["mixed"] >= 60, seconds
        assert seconds["later"] == 0
    finally:
        await broker.stop()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        return reply.read().decode()  # type: ignore[no-any-return]


@on_every_engine
async def test_a_message_by_id_live_or_archived(broker: Broker) -> None:
    live = await broker.publish("jobs", {"a": 1}, headers={"tenant": "t1"}, priority=3)
    binary = await broker.publish("jobs", b"\x00\xff\x10")
    view = await broker.insights().message(live)
    assert view is not None and view.live and view.state == "PENDING"
    assert view.body() == {"a": 1} and view.headers["tenant"] == "t1" and view.priority == 3
    assert view.to_json()["payload"] == {"a": 1}

    taken = await broker.engine.acquire(["jobs"], 2, 30)
    await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL, error="bad")
                                for d in taken])
    dead = await broker.insights().message(binary)
    assert dead is not None and not dead.live and dead.state == "FAILED"
    assert dead.error == "bad" and dead.deliveries == 1
    assert dead.to_json()["payload_base64"] == "AP8Q"
    json.dumps(dead.to_json())  # JSON-ready throughout
    assert await broker.insights().message(10**9) is None


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
async def test_a_row_with_malformed_headers_still_shows(broker: Broker) -> None:
    msg_id = await broker.publish("jobs", {"a": 1})
    await update_row(broker, msg_id, headers="[1, 2]", history="not json")
    view = await broker.insights().message(msg_id)
    assert view is not None
    assert "not an object" in view.headers["sqlmq-undecodable-headers"]
    assert "not valid JSON" in view.history[0]["undecodable"]


@on_every_engine
async def test_the_archive_is_searched_and_paginated_by_key(broker: Broker) -> None:
    ids = []
    for n in range(30):
        ids.append(await broker.publish("a" if n % 3 else "b", {"n": n}))
    taken = await broker.engine.acquire(["a", "b"], 30, 30)
    await broker.engine.settle([
        Settlement(d.id, d.deliveries, Outcome.FAIL if d.id % 2 else Outcome.COMPLETE,
                   error=f"100% broken_{d.id}" if d.id % 2 else None) for d in taken])

    async def walk(query: ArchiveQuery) -> list[Any]:
        seen, page = [], await broker.insights().archive(query)
        while True:
            seen += page.items
            if page.next is None:
                return seen
            page = await broker.insights().archive(page.next)

    everything = await walk(ArchiveQuery(limit=7))
    assert sorted(v.id for v in everything) == sorted(ids)  # each row exactly once
    keys = [(v.archived_at, v.id) for v in everything]
    assert keys == sorted(keys, reverse=True)

    failed_a = await walk(ArchiveQuery(queue="a", states=("FAILED",), limit=4))
    assert {v.id for v in failed_a} == {d.id for d in taken if d.id % 2 and d.queue == "a"}
    # the error filter is a plain substring: % and _ match themselves only
    assert {v.id for v in await walk(ArchiveQuery(error_contains="100% broken_"))} == {
        d.id for d in taken if d.id % 2}
    assert await walk(ArchiveQuery(error_contains="100%%")) == []
    newest = everything[0].archived_at
    assert await walk(ArchiveQuery(archived_from=newest + timedelta(seconds=1))) == []
    assert len(await walk(ArchiveQuery(archived_to=newest + timedelta(seconds=1)))) == 30


def test_bad_archive_queries_name_the_problem() -> None:
    with pytest.raises(ValueError, match="no archived state 'PENDING'"):
        ArchiveQuery(states=("PENDING",))
    with pytest.raises(ValueError, match="1 to 10000 rows"):
        ArchiveQuery(limit=0)


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_dead_letter_search_reads_an_index_on_a_large_archive(broker: Broker) -> None:
    """The dashboard's and ``sqlmq dlq list``'s query, on 300,000 archived rows of which a
    few hundred are dead letters: PostgreSQL reads an index, not the table."""
    a = broker.schema.archive.name
    async with broker.db.begin() as conn:
        await conn.execute(text(f"""
            INSERT INTO {a} (id, queue, headers, payload, state, attempts_count,
                             deliveries_count, created_at, archived_at, error, priority)
            SELECT g, 'q' || (g % 5), '{{}}'::jsonb, '\\x00'::bytea,
                   CASE WHEN g % 1000 = 0 THEN 'FAILED' ELSE 'COMPLETED' END, 1, 1,
                   now() - g * INTERVAL '1 second', now() - g * INTERVAL '1 second',
                   CASE WHEN g % 1000 = 0 THEN 'boom' END, 0
            FROM generate_series(1, 300000) AS g
        """))
        await conn.execute(text(f"ANALYZE {a}"))
    query = ArchiveQuery(queue="q0", states=("FAILED",), limit=50)
    page = await broker.insights().archive(query)
    assert len(page.items) == 50 and all(v.state == "FAILED" for v in page.items)
    stmt = _compiled_search(broker, query)
    async with broker.db.connect() as conn:
        plan = (await conn.execute(text(f"EXPLAIN (FORMAT JSON) {stmt}"))).scalar_one()
    nodes = _nodes(plan[0]["Plan"])
    print(json.dumps(plan, indent=1)[:3000])
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), plan
    assert any("Index" in n["Node Type"] for n in nodes), plan


def _compiled_search(broker: Broker, query: ArchiveQuery) -> str:
    from sqlalchemy.dialects import postgresql

    stmt = broker.engine.archive_search(query)  # type: ignore[attr-defined]
    return str(stmt.compile(dialect=postgresql.dialect(),
                            compile_kwargs={"literal_binds": True}))


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found
