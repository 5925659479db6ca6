"""Drain: preload N messages, then time how long it takes until every one is archived.

Three contenders on the same database in the same run: sqlmq (in this process), PGQueuer
(subprocesses in its own venv, PostgreSQL only) and the database's own limit, which runs
sqlmq's own acquire and settle statements in a server-side loop with no client at all.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from sqlalchemy import func, select, text

from sqlmq import Broker

from .common import PAYLOAD, QUEUE, drop_tables, fresh_broker, fresh_peer_schema, peer, url_for

#: sqlmq's configuration for a drain (a no-op handler wants big batches, few workers).
SQLMQ_DRAIN = {"workers": 4, "fetch_batch": 500, "prefetch": 1500, "flush_batch": 1000,
               "flush_interval": 0.02}
LIMIT_BATCH = 500


async def preload(broker: Broker, n: int, chunk: int = 5000) -> float:
    start = time.perf_counter()
    await publish_n(broker, n, chunk)
    elapsed = time.perf_counter() - start
    await analyze(broker)
    return elapsed


async def publish_n(broker: Broker, n: int, chunk: int = 5000, **options: Any) -> None:
    """``n`` messages of :data:`PAYLOAD` in batches of ``chunk``, each with ``options``
    (``channel=``, ``headers=``)."""
    for i in range(0, n, chunk):
        await broker.publish_batch(QUEUE, [PAYLOAD] * min(chunk, n - i), **options)


async def analyze(broker: Broker) -> None:
    """Give the planner statistics, as autovacuum would on a table in service: a table
    loaded a moment ago has none, and PostgreSQL then sorts the backlog on every acquire."""
    name = broker.schema.message.name
    statement = {"mariadb": f"ANALYZE TABLE {name}", "mysql": f"ANALYZE TABLE {name}"}.get(
        broker.db.dialect.name, f"ANALYZE {name}")
    async with broker.db.connect() as conn:
        await conn.execute(text(statement))
        await conn.commit()


async def archived(broker: Broker) -> int:
    async with broker.db.connect() as conn:
        return (await conn.execute(
            select(func.count()).select_from(broker.schema.archive)
        )).scalar_one()


async def drain_sqlmq(db: str, n: int, options: dict[str, Any] | None = None,
                      profile: str | None = None) -> float:
    """Seconds from start() until all ``n`` messages are archived."""
    opts = {**SQLMQ_DRAIN, **(options or {})}
    broker = await fresh_broker(db)
    try:
        await preload(broker, n)

        @broker.subscriber(QUEUE, **opts)
        async def handle(body: bytes) -> None:
            pass

        profiler = _profiler(profile)
        elapsed = await until_completed(broker, n)
        if profiler is not None:
            profiler.stop()
            print(profiler.output_text(unicode=False, color=False, show_all=False))
        await broker.stop()
        got = await archived(broker)
        if got != n:
            raise RuntimeError(f"sqlmq drain archived {got} of {n} messages")
        return elapsed
    finally:
        await broker.close()
        drop_tables(url_for(db))


async def timed_drain(broker: Broker, n: int, options: dict[str, Any],
                      sleep: float = 0.0) -> float:
    """Messages per second for ``broker``, loaded with ``n`` messages, to archive them all
    with a subscriber built from exactly ``options``, whose handler sleeps ``sleep``."""

    @broker.subscriber(QUEUE, **options)
    async def handle(body: bytes) -> None:
        if sleep:
            await asyncio.sleep(sleep)

    return await completed_rate(broker, n)


async def completed_rate(broker: Broker, n: int) -> float:
    """Messages per second for ``broker``'s subscribers to archive ``n`` messages, checked
    in the archive once they stopped."""
    elapsed = await until_completed(broker, n)
    await broker.stop()
    got = await archived(broker)
    if got != n:
        raise RuntimeError(f"drain archived {got} of {n} messages")
    return n / elapsed


async def until_completed(broker: Broker, n: int) -> float:
    """Start ``broker`` and return the seconds until its subscribers completed ``n``
    messages (still running: the caller stops it)."""
    start = time.perf_counter()
    await broker.start()
    while sum(r.counters.completed for r in broker.runtimes) < n:
        await asyncio.sleep(0.002)
    return time.perf_counter() - start


def _profiler(kind: str | None) -> Any:
    if kind != "pyinstrument":
        return None
    from pyinstrument import Profiler

    p = Profiler(async_mode="disabled", interval=0.0005)
    p.start()
    return p


def drain_pgqueuer(n: int, batch_size: int, procs: int) -> float:
    """Seconds until ``procs`` PGQueuer workers (batch ``batch_size``) have done ``n`` jobs."""
    import json

    from .common import spawn

    fresh_peer_schema()
    try:
        peer("preload", n)
        start = time.perf_counter()
        workers = [spawn(["work", str(n), str(batch_size)], peer_side=True)
                   for _ in range(procs)]
        for w in workers:
            out, _ = w.communicate(timeout=1800)
            if w.returncode != 0:
                raise RuntimeError("a PGQueuer worker failed")
            json.loads(out.strip().splitlines()[-1])
        return time.perf_counter() - start
    finally:
        peer("uninstall")


_LIMIT_LOOP = """
DO $bench$
DECLARE
    v_ids BIGINT[];
    v_dels INTEGER[];
    v_n INTEGER;
BEGIN
    LOOP
        WITH acquired AS ({acquire})
        SELECT array_agg(id), array_agg(deliveries_count) INTO v_ids, v_dels FROM acquired;
        EXIT WHEN v_ids IS NULL;
        COMMIT;
        {settle};
        COMMIT;
    END LOOP;
END
$bench$
"""


def limit_statement(engine: Any, batch: int) -> str:
    """sqlmq's PostgreSQL acquire and settle statements, inside one server-side loop.

    The ``$n`` parameters become the loop's variables and constants; each acquire and each
    settle commits on its own, as it does when the runtime drives them."""
    from sqlmq.engines.postgresql import statements as postgresql
    from sqlmq.engines.sql.statements import render

    acquire = render(postgresql.ACQUIRE, engine.names)
    acquire = _bind(acquire, [f"'{QUEUE}'", str(batch), "30"])  # queue, limit, lease
    settle = render(postgresql.SETTLE, engine.names)
    n = "cardinality(v_ids)"
    settle = _bind(settle, [  # ids, deliveries, outcomes, errors, delays, refunds, ...
        "v_ids", "v_dels",
        f"array_fill('COMPLETED'::TEXT, ARRAY[{n}])",
        f"array_fill(NULL::TEXT, ARRAY[{n}])",
        f"array_fill(0::DOUBLE PRECISION, ARRAY[{n}])",
        f"array_fill(0, ARRAY[{n}])",
        f"array_fill(1, ARRAY[{n}])",
        f"array_fill(NULL::TEXT, ARRAY[{n}])",
        f"array_fill(1, ARRAY[{n}])",  # keep: archive every row
        f"array_fill(NULL::BYTEA, ARRAY[{n}])",  # results: none kept
        f"array_fill(0, ARRAY[{n}])",  # answers: no caller waits
    ])
    last = ("SELECT id FROM archived UNION ALL SELECT id FROM done WHERE keep = 0\n"
            "UNION ALL SELECT id FROM moved")
    if last not in settle:
        raise RuntimeError("the settle statement changed shape; update bench/drain.py")
    settle = settle.replace(
        last, f"SELECT count(*) INTO v_n FROM ({last}) AS landed"
    )
    return _LIMIT_LOOP.format(acquire=acquire.strip(), settle=settle.strip())


def _bind(sql: str, values: list[str]) -> str:
    """``$n`` parameters replaced by ``values[n - 1]``."""
    return re.sub(r"\$(\d+)", lambda m: values[int(m.group(1)) - 1], sql)


async def drain_limit(n: int, batch: int = LIMIT_BATCH) -> float:
    """Seconds the server-side loop takes to acquire and archive ``n`` messages."""
    broker = await fresh_broker("postgresql")
    try:
        await preload(broker, n)
        statement = limit_statement(broker.engine, batch)
        async with broker.db.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            start = time.perf_counter()
            await conn.exec_driver_sql(statement)
            elapsed = time.perf_counter() - start
        got = await archived(broker)
        if got != n:
            raise RuntimeError(f"the in-database loop archived {got} of {n} messages")
        return elapsed
    finally:
        await broker.close()
        drop_tables(url_for("postgresql"))

