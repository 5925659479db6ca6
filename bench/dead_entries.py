"""Acquire over dead ready-index entries under a pinned xmin horizon (PostgreSQL), the
statement sqlmq runs against two bounded variants it could run.

Why the held-transaction run (``bench.run held``) slows down: while another session's
snapshot pins the horizon, the ready-index entry of every consumed message stays, pointing
to a row version that is dead to everyone but that session, so it is neither removed nor
marked dead in the index. acquire reads the index from the start of the queue's section,
twice (the priority-level probe, then the level's range), and checks each such entry
against the heap before it reaches the first ready message: its cost grows with the
messages consumed since the snapshot was taken.

The variants bound the scan below by a floor on ``next_attempt_at`` (here: the database's
time just before the fresh messages were published):

* ``floor``: the range scan starts at the floor; the level probe still walks the dead
  entries, but rejects them on the index tuple, without the heap;
* ``floor, level known``: the level is given instead of probed, so nothing below the floor
  is read at all.

Neither variant is what acquire runs; a floor needs a rule for messages that become ready
below it (a transaction that published long before it committed), which this does not
build. Usage::

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

from sqlmq.engines.sql import postgresql as sql

from .common import PG_URL, PREFIX, drop_tables, fresh_broker, table

FRESH = 10  # ready messages behind the dead entries at each measurement
TRIES = 5

INSERT = """
INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count, created_at,
                 next_attempt_at, priority)
SELECT 'q', '{{}}', '\\x78', 'PENDING', 0, 0, now(), now(), 0 FROM generate_series(1, $1)
"""


def variants(m: str) -> dict[str, str]:
    """The statement as it is, and the two bounded by ``$4``."""
    as_is = sql.ACQUIRE.replace("{m}", m)
    bounded = as_is.replace("AND next_attempt_at <= now()",
                            "AND next_attempt_at >= $4 AND next_attempt_at <= now()")
    probe_bounded = bounded.replace(
        "WHERE queue = $1 AND next_attempt_at IS NOT NULL\n     ORDER BY",
        "WHERE queue = $1 AND next_attempt_at >= $4\n     ORDER BY")
    known = bounded[:bounded.index("WITH RECURSIVE")] + "WITH levels(p) AS (SELECT 0), " \
        + bounded[bounded.index("ready AS ("):]
    assert as_is != bounded != probe_bounded != known
    return {"as is": as_is, "floor": probe_bounded, "floor, level known": known}


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
        insert = await conn.prepare(INSERT.format(m=m))
        statements = {name: await conn.prepare(text) for name, text in variants(m).items()}
        consumed = 0
        for target in dead_targets:
            while consumed < target:  # publish, acquire and delete, as a drain does
                await insert.fetch(min(5000, target - consumed))
                taken = await statements["as is"].fetch("q", 5000, 30.0)
                await conn.execute(f"DELETE FROM {m} WHERE id = ANY($1::bigint[])",
                                   [r[0] for r in taken])
                consumed += len(taken)
            times: dict[str, float] = {}
            for name, statement in statements.items():
                elapsed = []
                for _ in range(TRIES):
                    floor = await conn.fetchval("SELECT now()")
                    await insert.fetch(FRESH)
                    args: tuple[Any, ...] = () if name == "as is" else (floor,)
                    started = time.perf_counter()
                    taken = await statement.fetch("q", 500, 30.0, *args)
                    elapsed.append((time.perf_counter() - started) * 1000)
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
                ["dead entries", "as is", "floor", "floor, level known"], rows))
    print(f"\nreproduce: .venv/bin/python -m bench.dead_entries --dead {args.dead}")


if __name__ == "__main__":
    main(sys.argv[1:])
