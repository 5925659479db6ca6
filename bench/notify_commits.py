"""Why overlapping publishes share one NOTIFY (sqlmq/engines/postgresql/wakes.py): PostgreSQL's
commits per second with and without a NOTIFY in each transaction.

A transaction that sent a NOTIFY holds the notification queue's lock from just before its
commit record until its WAL flush is done, so notifying commits cannot share a flush (group
commit). Here ``--connections`` connections each run one autocommit INSERT after another for
``--seconds``, first plain, then with ``pg_notify`` in the same statement (as sqlmq's
publishing INSERT sends it), alternated over ``--rounds``; commits per second and p50/p99 of
one statement.

    .venv/bin/python -m bench.notify_commits [--connections 16] [--seconds 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg

from .common import PG_URL, percentile

TABLE = "bench_notify_commits"
CASES = {
    "INSERT": f"INSERT INTO {TABLE} (v) VALUES ('x')",
    "INSERT + NOTIFY": (f"WITH i AS (INSERT INTO {TABLE} (v) VALUES ('x') RETURNING id) "
                        "SELECT pg_notify('bench_notify_commits', 'q') FROM i"),
}


async def _run(conns: list[asyncpg.Connection], statement: str, seconds: float
               ) -> tuple[float, float, float]:
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def one(conn: asyncpg.Connection) -> None:
        while time.perf_counter() < stop:
            start = time.perf_counter()
            await conn.execute(statement)
            latencies.append(1000 * (time.perf_counter() - start))

    await asyncio.gather(*(one(c) for c in conns))
    return len(latencies) / seconds, percentile(latencies, 50), percentile(latencies, 99)


async def main(connections: int, seconds: float, rounds: int) -> None:
    url = PG_URL.replace("postgresql+asyncpg://", "postgresql://")
    setup = await asyncpg.connect(url)
    await setup.execute(f"DROP TABLE IF EXISTS {TABLE}; "
                        f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, v text)")
    conns = [await asyncpg.connect(url) for _ in range(connections)]
    try:
        print(f"{connections} connections, one autocommit statement after another, "
              f"{seconds:.0f} s a run")
        print(f"{'round':>5}  {'statement':<16} {'commits/s':>10} {'p50 ms':>7} {'p99 ms':>7}")
        for r in range(1, rounds + 1):
            for name, statement in CASES.items():
                rate, p50, p99 = await _run(conns, statement, seconds)
                print(f"{r:>5}  {name:<16} {rate:>10,.0f} {p50:>7.2f} {p99:>7.2f}")
    finally:
        for c in conns:
            await c.close()
        await setup.execute(f"DROP TABLE IF EXISTS {TABLE}")
        await setup.close()
    print(f"\nreproduce: .venv/bin/python -m bench.notify_commits --connections {connections} "
          f"--seconds {seconds:g} --rounds {rounds}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    asyncio.run(main(args.connections, args.seconds, args.rounds))
