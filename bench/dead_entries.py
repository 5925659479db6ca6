"""Acquire over dead ready-index entries under a pinned xmin horizon (PostgreSQL): the
statement acquire runs without floors, the one it runs with them, and the sweep below them.

Why the held-transaction run (``bench.run held``) slowed down: while another session's
snapshot pins the horizon, the ready-index entry of every consumed message stays, pointing
to a row version that is dead to everyone but that session, so it is neither removed nor
marked dead in the index. Without floors (ACQUIRE, what a queue's first acquire runs)
acquire reads the index from the start of the queue's section, twice (the priority-level
probe, then the level's range), and checks each such entry against the heap before it
reaches the first ready message: its cost grows with the messages consumed since the
snapshot was taken.

* ``no floors``: ACQUIRE;
* ``floor``: ACQUIRE_ABOVE_FLOORS with the level known and its floor at the database's time
  just before the fresh messages were published: nothing below the floor is read;
* ``sweep``: SWEEP_BELOW_FLOORS with that floor, what the engine runs once a second on
  another connection to find messages that became ready below a floor; it reads what
  ``no floors`` read, once.

Usage::

    .venv/bin/python -m bench.dead_entries [--dead 0,20000,100000,300000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import asyncpg

from sqlmq.engines.postgresql import statements as sql

from .common import PG_URL, PREFIX, drop_tables, fresh_broker, table

FRESH = 10  # ready messages behind the dead entries at each measurement
TRIES = 5

INSERT = """
INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count, created_at,
                 next_attempt_at, priority)
SELECT 'q', '{{}}', '\\x78', 'PENDING', 0, 0, now(), now(), 0 FROM generate_series(1, $1)
"""


def statements_of(m: str) -> dict[str, str]:
    """What acquire runs without floors (the first acquire of a queue), with them, and the
    sweep that looks below them on another connection."""
    return {"no floors": sql.ACQUIRE.replace("{m}", m),
            "floor": sql.ACQUIRE_ABOVE_FLOORS.replace("{m}", m),
            "sweep": sql.SWEEP_BELOW_FLOORS.replace("{m}", m)}


async def measure(dead_targets: list[int]) -> list[list[Any]]:
    broker = await fresh_broker("postgresql")
    await broker.close()
    m = f"{PREFIX}message"
    conn = await asyncpg.connect(PG_URL)
    holder = await asyncpg.connect(PG_URL)
    rows: list[list[Any]] = []
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT 1")  # the snapshot pins the horizon from here on
        await conn.execute(sql.INDEX_PLANS_ON)  # the planner settings the engine's acquire has
        insert = await conn.prepare(INSERT.format(m=m))
        statements = {name: await conn.prepare(text)
                      for name, text in statements_of(m).items()}
        consumed = 0
        for target in dead_targets:
            while consumed < target:  # publish, acquire and delete, as a drain does
                await insert.fetch(min(5000, target - consumed))
                taken = await statements["no floors"].fetch("q", 5000, 30.0)
                await conn.execute(f"DELETE FROM {m} WHERE id = ANY($1::bigint[])",
                                   [r[0] for r in taken])
                consumed += len(taken)
            times: dict[str, float] = {}
            for name, statement in statements.items():
                elapsed = []
                for _ in range(TRIES):
                    floor = await conn.fetchval("SELECT date_part('epoch', now())")
                    await insert.fetch(FRESH)
                    started = time.perf_counter()
                    if name == "sweep":  # timed alone; the messages are then taken above it
                        found = await statement.fetch("q", [0], [floor])
                    elif name == "floor":
                        taken = await statement.fetch("q", 500, 30.0, [0], [floor])
                    else:
                        taken = await statement.fetch("q", 500, 30.0)
                    elapsed.append((time.perf_counter() - started) * 1000)
                    if name == "sweep":
                        assert found[0][1] is None, found  # nothing ready below the floor
                        taken = await statements["floor"].fetch("q", 500, 30.0, [0], [floor])
                    assert len(taken) == FRESH, (name, len(taken))
                    await conn.execute(f"DELETE FROM {m} WHERE id = ANY($1::bigint[])",
                                       [r[0] for r in taken])
                    consumed += FRESH
                times[name] = statistics.median(elapsed)
            rows.append([target, *(times[n] for n in statements)])
            print(f"  {target} dead entries: " + ", ".join(
                f"{n} {t:.2f} ms" for n, t in times.items()), file=sys.stderr, flush=True)
    finally:
        await holder.execute("ROLLBACK")
        await holder.close()
        await conn.close()
        drop_tables(PG_URL)
    return rows


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.dead_entries")
    p.add_argument("--dead", default="0,20000,100000,300000",
                   help="consumed messages behind the pinned horizon at each measurement")
    args = p.parse_args(argv)
    rows = asyncio.run(measure([int(n) for n in args.dead.split(",")]))
    print(table(f"acquire of {FRESH} ready messages behind dead ready-index entries, a "
                f"snapshot held open (ms, median of {TRIES})",
                ["dead entries", "no floors", "floor", "sweep (another connection)"], rows))
    print(f"\nreproduce: .venv/bin/python -m bench.dead_entries --dead {args.dead}")


if __name__ == "__main__":
    main(sys.argv[1:])
