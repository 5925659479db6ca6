"""A fresh message table under a steady load: pickup latency per 10 s window.

Every new deployment starts with an empty table that PostgreSQL has no statistics for, and
autovacuum's first ANALYZE comes a minute or more after the load starts. A plan chosen
from those missing statistics (a bitmap scan of every ready index entry, dead ones
included, then a sort) reads the whole table on every acquire: the acquire time grows with
the dead tuples and the pickup p99 with it, until the first ANALYZE. This runs one process
publishing at a fixed rate to a no-op subscriber on freshly migrated tables and reports,
per window, the pickup (publish call -> handler start) p50/p99 and the mean acquire time.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from sqlalchemy import text

from .common import QUEUE, drop_tables, fresh_broker, percentile, url_for
from .drain import analyze
from .pacing import latency_of, paced

WINDOW = 10.0


async def fresh_table(db: str, rate: float, seconds: float,
                      analyzed_empty: bool = False) -> tuple[list[list[Any]], str]:
    """Rows ``[window, picked up, p50 ms, p99 ms, max ms, acquires, mean acquire ms]``, and
    the table's dead tuples, autovacuum's rounds and the cost of one more acquire at the end
    (PostgreSQL). ``analyzed_empty``: the table has the statistics of an empty table, as
    autovacuum leaves them on a queue that drained, rather than none."""
    broker = await fresh_broker(db)
    if analyzed_empty:
        await analyze(broker)
    picked: list[tuple[float, float]] = []  # (seconds since start, pickup latency)
    acquires: list[tuple[float, float]] = []  # (seconds since start, acquire seconds)
    t0 = time.time()
    engine = broker.engine
    acquire = engine.acquire

    async def timed_acquire(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await acquire(*args, **kwargs)
        finally:
            acquires.append((time.time() - t0, time.perf_counter() - start))

    engine.acquire = timed_acquire  # type: ignore[method-assign]

    @broker.subscriber(QUEUE)
    async def handle(body: bytes) -> None:
        picked.append((time.time() - t0, latency_of(body)))

    try:
        await broker.start()
        t0 = time.time()
        await paced(rate, seconds, lambda p: broker.publish(QUEUE, p))
        deadline = time.monotonic() + 60
        while len(picked) < int(rate * seconds) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        tail = (await _table_state(broker) + "; " + await _acquire_cost(broker)
                if db == "postgresql" else "-")
    finally:
        await broker.close()
        drop_tables(url_for(db))
    rows = []
    for w in range(int(seconds // WINDOW) + 1):
        lo, hi = w * WINDOW, (w + 1) * WINDOW
        lat = [1000 * v for t, v in picked if lo <= t < hi]
        acq = [1000 * v for t, v in acquires if lo <= t < hi]
        if lat or acq:
            rows.append([f"{lo:.0f}-{hi:.0f} s", len(lat), percentile(lat, 50),
                         percentile(lat, 99), max(lat, default=float("nan")), len(acq),
                         sum(acq) / len(acq) if acq else float("nan")])
    return rows, tail


async def _acquire_cost(broker: Any) -> str:
    """What one more acquire costs the server now, as the engine runs it (its prepared
    statement, on its own connection, with its session settings): the plan's scans, the
    buffers it touches and its time. The queue is empty by now, so it takes nothing; what
    it reads is the dead rows a plan cannot skip. Buffers do not depend on the machine's
    load, times do."""
    from sqlmq.engines.sql.kept_connections import driver_connection

    engine = broker.engine
    conn = await engine._checkout()
    try:
        raw = await driver_connection(conn)
        name = await raw.fetchval("SELECT name FROM pg_prepared_statements WHERE statement = $1",
                                  engine._acquire_one)
        if name is None:
            return "acquire: not prepared on this connection"
        doc = await raw.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}"
                                 f"('{QUEUE}', 100, 30.0)")
    finally:
        await engine._checkin(conn)
    doc = (json.loads(doc) if isinstance(doc, str) else doc)[0]
    scans, todo = [], [doc["Plan"]]
    while todo:
        node = todo.pop()
        todo += node.get("Plans", [])
        if node["Node Type"].endswith("Scan") and ("Relation Name" in node
                                                  or "Index Name" in node):
            scans.append(f"{node['Node Type']} {node.get('Index Name', '')}".strip())
    plan = doc["Plan"]
    buffers = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
    return (f"one more acquire: {buffers} buffers, {doc['Execution Time']:.2f} ms, "
            f"{' + '.join(sorted(scans))}")


async def _table_state(broker: Any) -> str:
    async with broker.db.connect() as conn:
        row = (await conn.execute(text(
            "SELECT n_dead_tup, autoanalyze_count, autovacuum_count FROM pg_stat_user_tables "
            "WHERE relname = :name"), {"name": broker.schema.message.name})).one()
    return f"dead tuples {row[0]}, autoanalyze {row[1]}, autovacuum {row[2]}"
