"""A schedule run by three OS processes at once, on each database: every tick is published
exactly once (the database decides, not a leader), and a restart after a gap with
``catch_up="all"`` fills the gap, each missed tick once however many processes race for it."""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from sqlmq import Broker

from .conftest import rows, wait_until
from .procs import BEAT, ready_marker, spawn_worker, terminate, worker_log
from .test_periodic import headers_of, ticks_of

PROCESSES = 3
#: The schedule's interval: short, so that a few seconds see enough ticks.
EVERY = 0.5
STEP = timedelta(seconds=EVERY)


async def _run_for(db_url: str, prefix: str, tmp_path: Path, phase: str, seconds: float,
                   catch_up: str) -> None:
    outs = [tmp_path / f"{phase}{i}.ids" for i in range(PROCESSES)]
    procs = [spawn_worker(db_url, prefix, "work", out, every=EVERY, catch_up=catch_up)
             for out in outs]
    try:
        await wait_until(lambda: all(ready_marker(o).exists() for o in outs), timeout=60,
                         message="every worker process running")
        await asyncio.sleep(seconds)
    finally:
        codes = [terminate(p) for p in procs]
    assert codes == [0] * PROCESSES, "\n".join(worker_log(o) for o in outs)


def _consecutive(ticks: list[datetime]) -> bool:
    return all(b - a == STEP for a, b in itertools.pairwise(ticks))


async def test_three_processes_publish_every_tick_once_and_catch_up_after_a_gap(
        broker: Broker, db_url: str, prefix: str, tmp_path: Path) -> None:
    before = await broker.engine.now()
    await _run_for(db_url, prefix, tmp_path, "first", 4.0, "all")
    after = await broker.engine.now()
    first = ticks_of(await rows(broker, queue=BEAT))
    # Each tick once, none missed, from the first start (the tick just before it) to the last
    # stop: at least the ticks of the 4 s all three ran, however long the starts took.
    assert len(first) >= 4.0 / EVERY - 1 and _consecutive(first), first
    assert before - STEP < first[0] and first[-1] <= after, (before, first, after)

    await asyncio.sleep(3 * EVERY)  # no process runs: about three ticks are missed
    gap_over = await broker.engine.now()
    await _run_for(db_url, prefix, tmp_path, "second", 2 * EVERY, "all")
    found = await rows(broker, queue=BEAT)
    ticks = ticks_of(found)
    assert len(ticks) == len(set(ticks)) and _consecutive(ticks), ticks
    assert ticks[:len(first)] == first and ticks[-1] > gap_over

    t = broker.schema.schedule_tick
    async with broker.db.connect() as conn:
        recorded = {(r.tick_at, r.message_id) for r in await conn.execute(select(t))}
    assert recorded == {(datetime.fromisoformat(headers_of(r)["tick"]), r["id"]) for r in found}
