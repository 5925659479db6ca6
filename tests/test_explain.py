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

from sqlmq import Broker
from sqlmq.engines.postgres import acquire_text


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
