"""Sustained load with a held transaction (PostgreSQL): pickup latency and dead tuples per
10 s while another session keeps a writing transaction open.

An open transaction that has written something pins the xmin horizon: no row version that
died after it began can be removed, by autovacuum or by page pruning, until it ends. A
queue table makes dead versions at its message rate (a message inserted, updated when it
is acquired, deleted when it is archived), so they pile up for as long as the transaction
stays open and every scan that walks them slows down. This publishes at a fixed rate from
separate processes (one per 1,000 msg/s, one transaction per message) to a subscriber on
the defaults in this process, holds a writing transaction open on a connection of its own
from ``hold_at`` for ``hold`` seconds, and reports per window the messages handled, the
pickup p50/p99 (publish call -> handler start), the message table's dead tuples, its size,
and the row versions each handled message left behind (updates plus deletes of the table
per message handled; HOT updates among them can be pruned without a vacuum once the
horizon moves on).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import text

from .common import BENCH, PG_URL, PREFIX, QUEUE, drop_tables, fresh_broker, percentile, spawn
from .latency import publishers_for, read_json
from .pacing import latency_of

WINDOW = 10.0
RESULTS = BENCH / "results"

STATS = """
SELECT n_dead_tup, n_live_tup, n_tup_upd, n_tup_hot_upd, n_tup_del, autovacuum_count,
       pg_total_relation_size(relid)
FROM pg_stat_user_tables WHERE relname = :name
"""


async def held_transaction(rate: float, seconds: float, hold_at: float, hold: float
                           ) -> tuple[list[dict[str, Any]], str]:
    """Per-window figures and a summary line."""
    broker = await fresh_broker("postgresql")
    picked: list[tuple[float, float]] = []
    samples: list[tuple[float, tuple[Any, ...]]] = []
    name = broker.schema.message.name
    t0 = time.time()

    @broker.subscriber(QUEUE)
    async def handle(body: bytes) -> None:
        picked.append((time.time() - t0, latency_of(body)))

    async def sample() -> None:
        async with broker.db.connect() as conn:
            row = (await conn.execute(text(STATS), {"name": name})).one()
        samples.append((time.time() - t0, tuple(row)))

    async with broker.db.connect() as conn:
        autovacuum = ", ".join([
            f"{k}={(await conn.execute(text(f'SHOW {k}'))).scalar_one()}"
            for k in ("autovacuum", "autovacuum_naptime")])
    n = publishers_for(rate)
    publishers = []
    holder = asyncio.create_task(asyncio.sleep(0))
    try:
        await broker.start()
        await asyncio.sleep(0.5)
        t0 = time.time()
        await sample()
        publishers = [spawn(["bench.latency", "publish", PG_URL, PREFIX, str(rate / n),
                             str(seconds)]) for _ in range(n)]
        holder = asyncio.create_task(asyncio.to_thread(_hold, hold_at, hold))
        while time.time() - t0 < seconds + 5:
            await asyncio.sleep(WINDOW - (time.time() - t0) % WINDOW)
            await sample()
        achieved = 0.0
        for p in publishers:
            achieved += (await asyncio.to_thread(read_json, p, "rate", 120))["rate"]
        deadline = time.monotonic() + 120
        while len(picked) < int(rate / n * seconds) * n and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await sample()
        await holder
    finally:
        for p in publishers:
            p.kill()
        holder.cancel()
        await broker.close()
        drop_tables(PG_URL)
    return _windows(picked, samples, seconds, hold_at, hold), (
        f"offered {rate:,.0f} msg/s for {seconds:.0f} s, achieved {achieved:,.0f} msg/s; "
        f"transaction held from {hold_at:.0f} s to {hold_at + hold:.0f} s; server "
        f"{autovacuum}")


def _hold(at: float, seconds: float) -> None:
    """From ``at`` seconds on, keep a transaction that wrote a row open for ``seconds``."""
    time.sleep(at)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        table = f"{PREFIX}held"
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (x int)")
        try:
            with conn.transaction():
                conn.execute(f"INSERT INTO {table} VALUES (1)")
                time.sleep(seconds)
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


def _windows(picked: list[tuple[float, float]], samples: list[tuple[float, tuple[Any, ...]]],
             seconds: float, hold_at: float, hold: float) -> list[dict[str, Any]]:
    rows = []
    for w in range(int(seconds // WINDOW) + 1):
        lo, hi = w * WINDOW, (w + 1) * WINDOW
        lat = [1000 * v for t, v in picked if lo <= t < hi]
        if not lat:
            continue
        end = min((s for s in samples if s[0] >= hi - 0.5), key=lambda s: s[0],
                  default=samples[-1])
        start = max((s for s in samples if s[0] <= lo + 0.5), key=lambda s: s[0],
                    default=samples[0])
        dead, _live, upd, hot, dele, vacuums, size = end[1]
        made = (upd - start[1][2]) + (dele - start[1][4])
        rows.append({
            "window": f"{lo:.0f}-{hi:.0f} s", "from": lo,
            "held": hold_at < hi and lo < hold_at + hold,
            "msg/s": len(lat) / WINDOW, "p50": percentile(lat, 50), "p99": percentile(lat, 99),
            "dead": dead, "MB": size / 2**20, "autovacuums": vacuums,
            "versions/msg": made / len(lat),
            "hot": (hot - start[1][3]) / max(1, upd - start[1][2]),
        })
    return rows


def plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["from"] + WINDOW / 2 for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].plot(x, [r["msg/s"] for r in rows], marker=".")
    axes[0].set_ylabel("handled msg/s")
    axes[1].plot(x, [r["p50"] for r in rows], marker=".", label="p50")
    axes[1].plot(x, [r["p99"] for r in rows], marker=".", label="p99")
    axes[1].axhline(50, color="grey", linestyle=":", label="50 ms")
    axes[1].set_ylabel("pickup ms")
    axes[1].set_yscale("log")
    axes[1].legend()
    axes[2].plot(x, [r["dead"] / 1000 for r in rows], marker=".")
    axes[2].set_ylabel("dead tuples (k)")
    axes[2].set_xlabel("seconds")
    held = [r["from"] for r in rows if r["held"]]
    if held:
        for ax in axes:
            ax.axvspan(min(held), max(held) + WINDOW, color="orange", alpha=0.15)
    axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["RESULTS", "held_transaction", "plot"]
