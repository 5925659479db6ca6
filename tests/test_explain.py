"""The PostgreSQL acquire statement reads its index, not the table, however long the backlog.

A plan that scans the message table costs time in proportion to the backlog on every
acquire, which turns a drain quadratic. The plan is checked on a 200,000-row table with
statistics (as autovacuum keeps them on a table in service), for the statement exactly as
the engine sends it; and on a smaller table with a bigger batch, where a planner left to
itself hash-joins the batch to a scan of the whole table.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import text

from sqlmq import Broker, Outcome, Settlement
from sqlmq.engines.base import driver_connection
from sqlmq.engines.postgres import PostgresEngine, acquire_text


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


@pytest.mark.parametrize("db_kind", ["postgresql"])
@pytest.mark.parametrize(("rows", "batch"), [(200_000, 100), (20_000, 500)])
async def test_acquire_reads_the_ready_index_without_scanning_a_large_table(
    broker: Broker, rows: int, batch: int
) -> None:
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        # Ten queues; a tenth of the rows are being processed (no schedule), some are
        # scheduled in the future, most are ready.
        await conn.execute(text(f"""
            INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                             created_at, next_attempt_at, lease_expires_at)
            SELECT 'q' || (g % 10), '{{}}'::jsonb, '\\x00'::bytea,
                   CASE WHEN g % 10 = 3 THEN 'PROCESSING' ELSE 'PENDING' END, 0, 0, now(),
                   CASE WHEN g % 10 = 3 THEN NULL
                        ELSE now() + ((g % 7) - 5) * INTERVAL '1 minute' END,
                   CASE WHEN g % 10 = 3 THEN now() + INTERVAL '30 seconds' END
            FROM generate_series(1, {rows}) AS g
        """))
        await conn.execute(text(f"ANALYZE {m}"))
        statement = acquire_text("queue = :queue").format(**broker.schema.names)
        result = await conn.execute(text("EXPLAIN (FORMAT JSON) " + statement),
                                    {"queue": "q1", "limit": batch, "lease": 30.0})
        raw = result.scalar_one()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    nodes = _nodes(plan)

    on_table = [n for n in nodes if n.get("Relation Name") == m]
    assert on_table, "the plan reads the message table somewhere"
    assert not [n for n in on_table if n["Node Type"] == "Seq Scan"], nodes
    assert f"ix_{m}_ready" in {n.get("Index Name") for n in nodes}
    # The index hands rows over in acquire order: nothing sorts the backlog.
    assert not [n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")], nodes


# Plan nodes that read a whole table or every index entry of a queue: a scan of the table, a
# bitmap scan (it visits every matching entry, dead ones included, before a sort can pick the
# first few), or a sort of everything ready; and (below) a scan of the message table that
# no index condition bounds.
_WHOLE_TABLE_NODES = {"Seq Scan", "Bitmap Heap Scan", "Bitmap Index Scan", "Sort",
                      "Incremental Sort"}


def _plan(raw: Any) -> dict[str, Any]:
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def _whole_table_reads(plan: dict[str, Any], table: str,
                       bounded: bool = True) -> list[dict[str, Any]]:
    return [n for n in _nodes(plan)
            if n["Node Type"] in _WHOLE_TABLE_NODES
            or (bounded and n["Node Type"].endswith("Scan") and n.get("Relation Name") == table
                and "Index Cond" not in n)]


@pytest.mark.parametrize("db_kind", ["postgresql"])
@pytest.mark.parametrize("statistics", ["of the empty table", "none"])
async def test_acquire_and_settle_plans_do_not_depend_on_the_statistics_of_a_new_table(
    broker: Broker, statistics: str
) -> None:
    """A new deployment starts with an empty table and no statistics (or an empty table's,
    after an ANALYZE); autovacuum's first ANALYZE comes a minute or more into the load. The
    plans acquire and settle run with, on the engine's own connection, must not scan the
    table, nor every index entry of a queue, however many dead rows pile up meanwhile: the
    plan the prepared statement keeps after running on the empty table, and any generic or
    custom plan made now. Acquire reads the ready index and the primary key, each bounded
    by an index condition. (Settle may still read the whole primary key index from the
    statistics of an empty table: see the note at _INDEX_PLANS.)"""
    engine = broker.engine
    assert isinstance(engine, PostgresEngine)
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        await conn.execute(text(f"ALTER TABLE {m} SET (autovacuum_enabled = false)"))
        if statistics != "none":
            await conn.execute(text(f"ANALYZE {m}"))
    for _ in range(8):  # from the sixth execution on, PostgreSQL may keep a generic plan
        assert await engine.acquire(["q1"], 100, 30.0) == []
        assert await engine.settle([Settlement(1, 1, Outcome.COMPLETE)]) == set()
    async with broker.db.begin() as conn:  # 60,000 messages published, acquired, settled
        await conn.execute(text(f"""
            INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                             created_at, next_attempt_at)
            SELECT 'q1', '{{}}'::jsonb, '\\x00'::bytea, 'PENDING', 0, 0, now(), now()
            FROM generate_series(1, 60000)
        """))
        await conn.execute(text(f"UPDATE {m} SET state = 'PROCESSING', next_attempt_at = NULL"))
        await conn.execute(text(f"DELETE FROM {m}"))

    conn = await engine._checkout()  # the kept connection acquire and settle ran on
    raw = await driver_connection(conn)
    try:
        names = {r["statement"]: r["name"] for r in await raw.fetch(
            "SELECT name, statement FROM pg_prepared_statements")}
        calls = {
            "acquire": f"EXECUTE {names[engine._acquire_one]}('q1', 100, 30.0)",
            "settle": f"EXECUTE {names[engine._settle]}('{{1}}', '{{1}}', '{{COMPLETED}}', "
                      "'{NULL}', '{0}', '{0}', '{1}', '{NULL}')",
        }
        found: dict[str, Any] = {}
        for mode in ("auto", "force_generic_plan", "force_custom_plan"):
            await raw.execute(f"SET plan_cache_mode = {mode}")
            for name, call in calls.items():
                plan = _plan(await raw.fetchval("EXPLAIN (FORMAT JSON) " + call))
                found[f"{name}, {mode}"] = plan
    finally:
        await raw.execute("RESET plan_cache_mode")
        await engine._checkin(conn)

    for case, plan in found.items():
        acquire = case.startswith("acquire")
        assert not _whole_table_reads(plan, m, bounded=acquire), (case, _nodes(plan))
        if acquire:
            assert f"ix_{m}_ready" in {n.get("Index Name") for n in _nodes(plan)}, case


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_the_planner_settings_of_acquire_do_not_reach_the_pool(broker: Broker) -> None:
    """The settings stay on sqlmq's kept connections: the pool, which may be a user's own
    engine shared with the application, gets its connections back as they were."""
    await broker.engine.acquire(["q1"], 10, 30.0)
    await broker.engine.close()
    pool_size = broker.db.pool.checkedin()  # type: ignore[attr-defined]
    assert pool_size >= 1
    conns = [await broker.db.connect() for _ in range(pool_size)]
    try:
        for conn in conns:
            assert (await conn.execute(text("SHOW enable_seqscan"))).scalar() == "on"
    finally:
        for conn in conns:
            await conn.close()
