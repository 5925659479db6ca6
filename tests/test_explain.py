"""The PostgreSQL acquire statement reads its index, not the table, however long the backlog
(and MariaDB's empty poll reads no delayed backlog: the last test).

A plan that scans the message table costs time in proportion to the backlog on every
acquire, which turns a drain quadratic. The plan is checked on a 200,000-row table with
statistics (as autovacuum keeps them on a table in service), for the statement exactly as
the engine sends it; and on a smaller table with a bigger batch, where a planner left to
itself hash-joins the batch to a scan of the whole table.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

import pytest
from sqlalchemy import text

from sqlmq import Broker, Outcome, Settlement
from sqlmq.engines.postgresql import statements as postgresql
from sqlmq.engines.postgresql.engine import PostgresEngine
from sqlmq.engines.sql.kept_connections import driver_connection
from sqlmq.engines.sql.statements import render


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


@pytest.mark.parametrize("db_kind", ["postgresql"])
@pytest.mark.parametrize(("rows", "batch"), [(200_000, 100), (20_000, 500)])
@pytest.mark.parametrize("floors", ["none", "known level", "unknown level"])
async def test_acquire_reads_the_ready_index_without_scanning_a_large_table(
    broker: Broker, rows: int, batch: int, floors: str
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
        if floors == "none":  # what the Spark source leases with, planned as it plans it
            from sqlmq.engines.postgresql.spark_ledger import _INDEX_PLANS_LOCAL

            for setting in _INDEX_PLANS_LOCAL:
                await conn.exec_driver_sql(setting)
            statement = postgresql.ACQUIRE
            args: tuple[Any, ...] = ("q1", batch, 30.0)
        else:  # what the engine acquires with: level 0 known (its floor a minute ago) or not
            # With the planner settings the engine sets for it: a range bounded on both sides
            # is estimated small, and left to itself the planner bitmap-scans it and sorts.
            for setting in postgresql.INDEX_PLANS_ON.split(";"):
                await conn.exec_driver_sql(setting)
            statement = postgresql.ACQUIRE_ABOVE_FLOORS
            known = floors == "known level"
            args = ("q1", batch, 30.0, [0] if known else [], [time.time() - 60] if known else [])
        result = await conn.exec_driver_sql(
            "EXPLAIN (FORMAT JSON) " + render(statement, broker.engine.names),  # type: ignore[attr-defined]
            args)
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
            "acquire": f"EXECUTE {names[engine._acquire_one]}('q1', 100, 30.0, '{{}}', '{{}}')",
            "acquire above a floor": f"EXECUTE {names[engine._acquire_one]}"
                                     "('q1', 100, 30.0, '{0}', '{1795000000}')",
            "settle": f"EXECUTE {names[engine._settle]}('{{1}}', '{{1}}', '{{COMPLETED}}', "
                      "'{NULL}', '{0}', '{0}', '{1}', '{NULL}', '{1}', NULL, NULL)",
        }
        found: dict[str, Any] = {}
        for mode in ("auto", "force_generic_plan", "force_custom_plan"):
            await raw.execute(f"SET plan_cache_mode = {mode}")
            for name, call in calls.items():
                plan = _plan(await raw.fetchval("EXPLAIN (FORMAT JSON) " + call))
                found[f"{name}, {mode}"] = plan
    finally:
        await raw.execute(postgresql.INDEX_PLANS_ON)  # as the engine keeps its connection
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
    await broker.engine._close_kept()  # type: ignore[attr-defined]  # close() also disposes
    pool_size = broker.db.pool.checkedin()  # type: ignore[attr-defined]
    assert pool_size >= 1
    conns = [await broker.db.connect() for _ in range(pool_size)]
    try:
        for conn in conns:
            assert (await conn.execute(text("SHOW enable_seqscan"))).scalar() == "on"
            assert (await conn.execute(text("SHOW plan_cache_mode"))).scalar() == "auto"
    finally:
        for conn in conns:
            await conn.close()


def _paths_to(plan: dict[str, Any], index: str,
              above: tuple[dict[str, Any], ...] = ()) -> list[tuple[dict[str, Any], ...]]:
    """For each node scanning ``index``: the nodes from the root down to it."""
    here = (*above, plan)
    found = [here] if plan.get("Index Name") == index else []
    for child in plan.get("Plans", []):
        found += _paths_to(child, index, here)
    return found


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_acquire_by_priority_reads_the_ready_index_in_order_on_a_million_rows(
    broker: Broker,
) -> None:
    """A million-row backlog over ten queues with mixed priorities (-1 to 3), a tenth of it
    PROCESSING and some of it scheduled in the future (high priorities included): acquire,
    of one queue or of several, is an index scan of the ready index in acquire order, with
    no sequential scan, no bitmap scan and no sort of the backlog, with the table's
    statistics and with the settings of sqlmq's own connections: the priority levels present
    are found by one index descent each, then each level's ready entries are read as a
    range. One queue: no sort at all. Several queues: each read so, and stopped by a LIMIT;
    only what those LIMITs let through (at most the batch size per queue) is sorted into one
    order."""
    m = broker.schema.message.name
    ready = f"ix_{m}_ready"
    async with broker.db.begin() as conn:
        await conn.execute(text(f"""
            INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                             created_at, next_attempt_at, lease_expires_at, priority)
            SELECT 'q' || (g % 10), '{{}}'::jsonb, '\\x00'::bytea,
                   CASE WHEN g % 10 = 3 THEN 'PROCESSING' ELSE 'PENDING' END, 0, 0, now(),
                   CASE WHEN g % 10 = 3 THEN NULL
                        ELSE now() + ((g % 7) - 5) * INTERVAL '1 minute' END,
                   CASE WHEN g % 10 = 3 THEN now() + INTERVAL '30 seconds' END,
                   (g % 5) - 1
            FROM generate_series(1, 1000000) AS g
        """))
        await conn.execute(text(f"ANALYZE {m}"))
    names = broker.engine.names  # type: ignore[attr-defined]
    calls = {"one queue": (render(postgresql.ACQUIRE, names), ("q1", 100, 30.0)),
             "three queues": (render(postgresql.ACQUIRE_QUEUES, names),
                              (["q1", "q2", "q4"], 100, 30.0))}
    plans: dict[str, dict[str, Any]] = {}
    for settings in ("statistics", "index plans"):
        async with broker.db.begin() as conn:
            if settings == "index plans":
                for setting in postgresql.INDEX_PLANS_ON.split(";"):
                    await conn.exec_driver_sql(setting)
            for name, (statement, args) in calls.items():
                result = await conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, args)
                plans[f"{name}, {settings}"] = _plan(result.scalar_one())

    for case, plan in plans.items():
        nodes = _nodes(plan)
        assert not [n for n in nodes if n["Node Type"] in (
            "Seq Scan", "Bitmap Heap Scan", "Bitmap Index Scan")], (case, nodes)
        if case.startswith("one queue"):
            assert not [n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")], (
                case, nodes)
        paths = _paths_to(plan, ready)
        # the ready ranges: a scan per priority level, which stops at the first entry not due
        assert [p for p in paths if "next_attempt_at <= now()" in p[-1]["Index Cond"]], case
        for path in paths:
            assert path[-1]["Node Type"] in ("Index Scan", "Index Only Scan"), (case, path[-1])
            # every scan of the index is stopped by a LIMIT; a sort (several queues) only
            # orders what those LIMITs let through, never the backlog
            kinds = [n["Node Type"] for n in path]
            limits = [i for i, k in enumerate(kinds) if k == "Limit"]
            sorts = [i for i, k in enumerate(kinds) if k in ("Sort", "Incremental Sort")]
            assert limits and (not sorts or max(sorts) < max(limits)), (case, kinds)


@pytest.mark.parametrize("db_kind", ["mariadb"])
async def test_mariadb_acquire_reads_no_delayed_or_inflight_backlog(broker: Broker) -> None:
    """MariaDB: with 20,000 delayed messages at each of two priorities, 20,000 in flight at
    the lower one and nothing ready, acquire's level, lock and next-level statements (as the
    engine renders them) read a handful of index entries at each level, not the backlog (a
    scan of the ready index without the levels walks every in-flight and delayed entry of
    each level: 250 ms per empty poll at 100,000), counted by the session's handler reads.
    A message then ready at the lower priority, behind the delayed higher ones, is taken by
    as few reads, and by the engine's acquire."""
    from sqlmq.engines.mysql.engine import TOP_LEVEL, MysqlEngine

    engine = broker.engine
    assert isinstance(engine, MysqlEngine)
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        await conn.exec_driver_sql("SET SESSION max_recursive_iterations = 100000")
        later = "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR"
        for priority, due in ((0, later), (9, later), (0, "NULL")):
            await conn.exec_driver_sql(f"""
                INSERT INTO {m} (queue, headers, payload, state, attempts_count,
                                 deliveries_count, created_at, next_attempt_at, priority)
                WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 20000)
                SELECT 'q', '{{}}', 'x', IF({due} IS NULL, 'PROCESSING', 'PENDING'), 0, 0,
                       UTC_TIMESTAMP(6), {due}, {priority} FROM g""")
        await conn.exec_driver_sql(f"ANALYZE TABLE {m} PERSISTENT FOR ALL")
    lock = engine._acquire_lock(2)

    async def reads(conn: Any) -> int:
        rows = await conn.exec_driver_sql(
            "SHOW SESSION STATUS WHERE Variable_name IN ('Handler_read_first', "
            "'Handler_read_key', 'Handler_read_last', 'Handler_read_next', "
            "'Handler_read_prev', 'Handler_read_rnd', 'Handler_read_rnd_next')")
        return sum(int(v) for _, v in rows.all())

    async def poll(below: int) -> tuple[int, Any, Any]:
        """The level below ``below``, its ready rows locked, the next level: handler reads,
        the ids locked, and the two levels."""
        queues = ["q", "other"]
        async with broker.db.begin() as conn:
            before = await reads(conn)
            await conn.exec_driver_sql(lock.level, tuple(a for q in queues for a in (q, below)))
            await conn.exec_driver_sql(lock.lock, (*queues, 100))
            await conn.exec_driver_sql(lock.next_level, tuple(queues))
            read = await reads(conn) - before
            taken, *levels = (await conn.exec_driver_sql(
                "SELECT @sqlmq_take, @sqlmq_level, @sqlmq_next")).one()
            await conn.rollback()
        return read, taken, levels

    read, taken, levels = await poll(TOP_LEVEL)
    assert taken is None and levels == [9, 0] and read < 30, read
    read, taken, levels = await poll(9)
    assert taken is None and levels == [0, None] and read < 30, read
    (ready,) = await broker.publish_batch("q", [b"now"])
    read, taken, _ = await poll(9)
    assert json.loads(taken) == [ready] and read < 30, read
    assert [d.id for d in await engine.acquire(["q"], 10, 30.0)] == [ready]


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_acquire_of_a_paused_queue_reads_none_of_its_backlog(broker: Broker) -> None:
    """A paused queue (schema version 11) with 100,000 ready messages: each acquire
    statement (one queue, above floors or not, and several queues) probes the pause table
    and reads nothing of the message table's ready index for it (the scans are never
    executed), and takes nothing."""
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        await conn.execute(text(f"""
            INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                             created_at, next_attempt_at)
            SELECT 'q1', '{{}}'::jsonb, '\\x00'::bytea, 'PENDING', 0, 0, now(),
                   now() - INTERVAL '1 minute'
            FROM generate_series(1, 100000)
        """))
        await conn.execute(text(f"ANALYZE {m}"))
    assert await broker.pause("q1")
    names = broker.engine.names  # type: ignore[attr-defined]
    calls = {"one queue": (postgresql.ACQUIRE, ("q1", 100, 30.0)),
             "above floors": (postgresql.ACQUIRE_ABOVE_FLOORS,
                              ("q1", 100, 30.0, [0], [time.time() - 600])),
             "several queues": (postgresql.ACQUIRE_QUEUES, (["q1", "q1"], 100, 30.0))}
    for name, (statement, args) in calls.items():
        async with broker.db.begin() as conn:
            result = await conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + render(statement, names), args)
            plan = _plan(result.scalar_one())
            await conn.rollback()
        nodes = _nodes(plan)
        assert plan["Actual Rows"] == 0, name
        ready = [n for n in nodes if n.get("Index Name") == f"ix_{m}_ready"]
        assert ready and all(n["Actual Loops"] == 0 for n in ready), (name, ready)
        assert [n for n in nodes if n.get("Relation Name") == broker.schema.queue_pause.name
                and n["Actual Loops"] > 0], (name, nodes)
    assert await broker.engine.acquire(["q1"], 100, 30.0) == []


@pytest.mark.parametrize("db_kind", ["mariadb"])
async def test_mariadb_acquire_of_a_paused_queue_reads_none_of_its_backlog(
        broker: Broker) -> None:
    """MariaDB: 20,000 ready messages in a paused queue; the level probe (by the rendered
    statements, counted in handler reads) reads a handful of entries, not the backlog, and
    nothing is locked; a queue beside it at the same level is taken from as usual."""
    from sqlmq.engines.mysql.engine import TOP_LEVEL, MysqlEngine

    engine = broker.engine
    assert isinstance(engine, MysqlEngine)
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        await conn.exec_driver_sql("SET SESSION max_recursive_iterations = 100000")
        await conn.exec_driver_sql(f"""
            INSERT INTO {m} (queue, headers, payload, state, attempts_count,
                             deliveries_count, created_at, next_attempt_at, priority)
            WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 20000)
            SELECT 'paused', '{{}}', 'x', 'PENDING', 0, 0, UTC_TIMESTAMP(6),
                   UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, 0 FROM g""")
        await conn.exec_driver_sql(f"ANALYZE TABLE {m} PERSISTENT FOR ALL")
    assert await broker.pause("paused")
    lock = engine._acquire_lock(1)

    async with broker.db.begin() as conn:
        before = await _handler_reads(conn)
        for statement, args in lock.statements(["paused"], TOP_LEVEL, 100, 30.0)[:2]:
            await conn.exec_driver_sql(statement, tuple(args))
        read = await _handler_reads(conn) - before
        taken, level = (await conn.exec_driver_sql("SELECT @sqlmq_take, @sqlmq_level")).one()
        await conn.rollback()
    assert (taken, level) == (None, None) and read < 30, read
    assert await engine.acquire(["paused"], 100, 30.0) == []
    (other,) = await broker.publish_batch("other", [b"beside"])
    assert [d.id for d in await engine.acquire(["paused", "other"], 100, 30.0)] == [other]


async def _handler_reads(conn: Any) -> int:
    rows = await conn.exec_driver_sql(
        "SHOW SESSION STATUS WHERE Variable_name IN ('Handler_read_first', "
        "'Handler_read_key', 'Handler_read_last', 'Handler_read_next', "
        "'Handler_read_prev', 'Handler_read_rnd', 'Handler_read_rnd_next')")
    return sum(int(v) for _, v in rows.all())


@pytest.mark.parametrize("db_kind", ["postgresql", "sqlite"])
async def test_the_limited_pick_reads_its_partial_index_in_order(broker: Broker) -> None:
    """The limited channels' pick reads each channel's next messages from the index
    ``(channel, priority DESC, channel_due_at, id)``, partial on ``fair_key IS NULL`` since
    schema version 17, in order and cut at ``most``: never the index ``(channel, fair_key,
    id)``, which matches the condition by both its columns but holds the channel's messages
    in id order, so that its whole backlog is sorted (SQLite chose it, with statistics and
    without, until the condition was marked ``likely()``). SQLite's statement is its own
    (``DUE_PER_CHANNEL``, run straight on the driver); its per-channel read sorts nothing."""
    from sqlalchemy import text

    await broker.set_channel_default("q", max_concurrency=2)
    await broker.set_channel_default("o", ordered=True)
    for i in range(20):
        await broker.publish_batch("q", [b"x"] * 300, channel=f"c{i}")
        await broker.publish_batch("o", [b"x"] * 300, channel=f"o{i}")
    (urgent,) = await broker.publish_batch("q", [b"u"], channel="c3", priority=5)
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        await conn.execute(text(f"ANALYZE {m}"))
    async with broker.db.connect() as conn:
        if conn.dialect.name == "sqlite":  # its own statement, straight on the driver
            sql = broker.engine._due_per_channel_sql
            args = {"names": json.dumps(["c3", "c4"]), "queues": json.dumps(["q"]), "most": 2}
            nodes = (await conn.execute(text("EXPLAIN QUERY PLAN " + sql), args)).all()
            plan = " | ".join(r[3] for r in nodes)
            # the channel's read (the correlated subquery) sorts nothing; only the window
            # outside it sorts what the reads returned
            inner = {r[0] for r in nodes if r[3].startswith("CORRELATED LIST SUBQUERY")}
            assert [r for r in nodes if r[1] in inner and "TEMP B-TREE" in r[3]] == [], plan
            rows = (await conn.execute(text(sql), args)).all()
        else:
            statement, params = broker.engine._channel_sql.due_of(["c3", "c4"])
            bound = statement.params(**params, queues=["q"], most=2)
            sql = str(bound.compile(dialect=conn.dialect,
                                    compile_kwargs={"literal_binds": True}))
            plan = " | ".join(r[0] for r in await conn.exec_driver_sql("EXPLAIN " + sql))
            rows = (await conn.exec_driver_sql(sql)).all()
    assert f"ix_{m}_channel_due" in plan and f"ix_{m}_channel_key" not in plan, plan
    first = {(r.channel, r.rn): r.id for r in rows}
    assert sorted(first) == [("c3", 1), ("c3", 2), ("c4", 1), ("c4", 2)]
    assert first["c3", 1] == urgent


@pytest.mark.parametrize("db_kind", ["postgresql"])
@pytest.mark.parametrize("ordered", [False, True])
async def test_the_fair_acquire_reads_the_fair_index_and_takes_its_rows_by_id(
        broker: Broker, ordered: bool) -> None:
    """The fair acquire, as the engine runs it (its planner settings, a generic plan),
    over 200 channels of 100 with statistics: the fair index read in order, each taken
    row fetched by its id; nothing reads the message table or its primary key whole.
    Since the fair read reads an ordered channel's mark from the row (schema version 19)
    instead of looking its channel up, the planner expects as many rows as asked; the take
    joined to ready by id alone then walked the primary key from its start to the highest
    id taken (a merge join), as much of the table as the backlog before it."""
    from sqlalchemy import text

    engine = broker.engine
    assert isinstance(engine, PostgresEngine)
    if ordered:
        await broker.set_channel_default("q", ordered=True)
    for i in range(200):
        await broker.publish_batch("q", [b"x"] * 100, channel=f"c{i}")
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        await conn.execute(text(f"ANALYZE {m}"))
    if ordered:  # every head running: the read goes through their followers
        assert len(await engine.acquire(["q"], 200, 30.0)) == 200
    conn = await engine._checkout()
    raw = await driver_connection(conn)
    try:
        await raw.execute(postgresql.INDEX_PLANS_ON)
        tr = raw.transaction()
        await tr.start()
        try:
            plan = _plan(await raw.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) "
                                            + engine._acquire_fair_sql, ["q"], 500, 30.0))
        finally:
            await tr.rollback()
    finally:
        await engine._checkin(conn)
    nodes = _nodes(plan)
    reads = [n for n in nodes
             if n.get("Relation Name") == m and n["Node Type"].endswith("Scan")]
    assert f"ix_{m}_fair" in {n.get("Index Name") for n in reads}, nodes
    unbounded = [n for n in reads if "Index Cond" not in n
                 or n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan")]
    assert not unbounded, unbounded
    assert plan["Actual Rows"] == (0 if ordered else 500)


@pytest.mark.parametrize("db_kind", ["sqlite"])
@pytest.mark.parametrize("ordered", [False, True])
async def test_sqlites_fair_pick_reads_the_fair_index_in_order(
        broker: Broker, ordered: bool) -> None:
    """SQLite's fair pick (``FAIR_PICK``, its own statement since it runs straight on the
    driver) over 200 channels of 100 with statistics: one range of the fair index, read in
    its order (no sort: the read stops at ``most``), the ordered channels' probes on the
    index ``(channel, fair_key, id)``; the heads of ordered channels only, none while they
    run. A list of queues (``FAIR_PICK_QUEUES``) reads the same index."""
    from sqlalchemy.engine import make_url

    from sqlmq.engines.sql.statements import channel_fields
    from sqlmq.engines.sqlite import statements as sqlite_sql

    if ordered:
        await broker.set_channel_default("q", ordered=True)
    for i in range(200):
        await broker.publish_batch("q", [b"x"] * 100, channel=f"c{i}")
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        await conn.execute(text(f"ANALYZE {m}"))
    fields = channel_fields(broker.engine.names)
    one, listed = (render(sqlite_sql.FAIR_PICK, fields),
                   render(sqlite_sql.FAIR_PICK_QUEUES, fields))
    args = {"queue": "q", "queues": json.dumps(["q", "other"]), "most": 300}
    path = make_url(broker.db.url).database
    raw = sqlite3.connect(path)
    try:
        nodes = raw.execute("EXPLAIN QUERY PLAN " + one, args).fetchall()
        plan = " | ".join(r[3] for r in nodes)
        assert f"SEARCH f USING INDEX ix_{m}_fair (queue=? AND fair_key>? AND fair_key<?)" \
            in plan, plan
        assert "TEMP B-TREE" not in plan and "SCAN" not in plan, plan
        assert f"ix_{m}_channel_key" in plan, plan
        listed_plan = " | ".join(r[3] for r in raw.execute("EXPLAIN QUERY PLAN " + listed,
                                                            args))
        assert f"USING INDEX ix_{m}_fair" in listed_plan, listed_plan
        rows = raw.execute(one, args).fetchall()
        assert rows == raw.execute(listed, args).fetchall()
        if ordered:
            assert [r[1] for r in rows] == [f"c{i}" for i in range(200)]
            assert all(r[5] == 1 for r in rows)
            assert len(await broker.engine.acquire(["q"], 200, 30.0)) == 200
            assert raw.execute(one, args).fetchall() == []
        else:
            assert len(rows) == 300 and all(r[5] == 0 for r in rows)
            assert [r[4] for r in rows] == sorted(r[4] for r in rows)
    finally:
        raw.close()


async def _query_plan(conn: Any, statement: Any, params: dict[str, Any]) -> list[Any]:
    """SQLite's EXPLAIN QUERY PLAN of ``statement`` (a read) as SQLAlchemy sends it, its
    parameters processed as for a run: the statement runs once, its text and parameters
    are caught on their way to the driver."""
    from sqlalchemy import event

    sent: list[tuple[str, Any]] = []

    def catch(_conn: Any, _cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
        sent.append((sql, parameters))

    sync = conn.sync_connection
    event.listen(sync, "before_cursor_execute", catch)
    try:
        await conn.execute(statement, params)
    finally:
        event.remove(sync, "before_cursor_execute", catch)
    ((sql, parameters),) = sent
    return (await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, parameters)).all()


@pytest.mark.parametrize("db_kind", ["postgresql", "sqlite"])
async def test_a_limited_channels_running_count_reads_its_partial_index(
        broker: Broker) -> None:
    """The count a concurrency limit is held to reads the index ``(channel, state,
    channel_due_at)`` (partial on ``fair_key IS NULL``, the messages of limited channels
    only, since schema version 18 on PostgreSQL, 20 on SQLite), not ``(channel, fair_key,
    id)``, which holds all of a limited channel's messages under one NULL key: the
    acquire's count (``ChannelSql.running``) and, on SQLite, the candidates' correlated
    count and the passing settle's (``SLOT_LIMITS``), SQLite's naming the index; each
    channel's running deliveries counted, and a channel without limits counts none."""
    import re

    await broker.set_channel_default("q", max_concurrency=2)
    for i in range(10):
        await broker.publish_batch("q", [b"x"] * 200, channel=f"c{i}")
        await broker.publish_batch("free", [b"x"] * 200, channel=f"f{i}")
    taken = await broker.engine.acquire(["q"], 4, 30)
    assert len(await broker.engine.acquire(["free"], 4, 30)) == 4
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        await conn.execute(text(f"ANALYZE {m}"))
    names = sorted({d.channel for d in taken})
    index = re.compile(rf"\bix_{m}_channel\b(?!_)")
    sql_ = broker.engine._channel_sql
    async with broker.db.connect() as conn:
        if conn.dialect.name == "sqlite":
            listed = {"names": json.dumps([*names, "f0", "f1"])}
            plans = [" | ".join(r[3] for r in await _query_plan(conn, statement, params))
                     for statement, params in [
                         (sql_.running, {"names": [*names, "f0", "f1"]}),
                         (sql_.candidates, {"queues": ["q"], "most_channels": 20}),
                         (text(broker.engine._slot_limits_sql), listed)]]
            counts = dict((await conn.execute(sql_.running, {"names": [*names, "f0"]}))
                          .all())
            slots = {r[0]: r[-1] for r in await conn.execute(
                text(broker.engine._slot_limits_sql), listed)}
            assert slots == {**counts, "f0": 0, "f1": 0}
        else:
            bound = sql_.running.params(names=names)
            sql = str(bound.compile(dialect=conn.dialect,
                                    compile_kwargs={"literal_binds": True}))
            plans = [" | ".join(r[0] for r in await conn.exec_driver_sql("EXPLAIN " + sql))]
            counts = dict((await conn.exec_driver_sql(sql)).all())
    for plan in plans:
        assert index.search(plan), plan
    assert counts == {name: sum(1 for d in taken if d.channel == name) for name in names}


@pytest.mark.parametrize("db_kind", ["mariadb"])
async def test_mariadb_passing_settle_probes_one_entry_per_channel_for_its_next_head(
        broker: Broker) -> None:
    """MariaDB: the passing settle's probe for an ordered channel's next message
    (PASS_HEADS, as the engine renders it) reads the first entry of the index ``(channel,
    fair_key, id)`` of each channel among the results, whatever the channel's kind. A
    limited channel's messages have no key, and the probe read past every one of them
    (``fair_key IS NOT NULL`` in a correlated subquery is no range MariaDB can seek: 1,878
    rows a settle, 3 ms of the 11-13 ms it took in ``bench.slot_cycle``; 2,031 handler
    reads here). It reads a handful now, finds no head there, and still finds an ordered
    channel's next one."""
    from sqlmq.engines.mysql.engine import MysqlEngine

    engine = broker.engine
    assert isinstance(engine, MysqlEngine)
    await broker.set_channel("limited", max_concurrency=2)
    await broker.set_channel("ordered", ordered=True)
    limited = await broker.publish_batch("q", [b"x"] * 2000, channel="limited")
    ordered = await broker.publish_batch("q", [b"x"] * 2000, channel="ordered")
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        await conn.exec_driver_sql(f"ANALYZE TABLE {m} PERSISTENT FOR ALL")
        # each channel's first message as if a settle in this transaction archived it
        await conn.exec_driver_sql(f"DELETE FROM {m} WHERE id IN ({limited[0]}, {ordered[0]})")
        heads = json.dumps([[limited[0], 1, "limited"], [ordered[0], 1, "ordered"]])
        before = await _handler_reads(conn)
        await conn.exec_driver_sql(engine._pass_heads_of(1), (heads, "q"))
        read = await _handler_reads(conn) - before
        (found,) = (await conn.exec_driver_sql("SELECT @sqlmq_heads")).one()
        await conn.rollback()
    assert json.loads(found) == [ordered[1]] and read < 40, read
