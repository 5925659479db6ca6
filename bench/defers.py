"""Defers: messages that defer themselves (``msg.defer(delay=0, state=…)``), as a
cooperative long task does between its steps, in defers per second. Four messages, four
workers, ``flush_interval=0`` (each result written at once), until ``--n`` deliveries ran.
Every defer is a settle through the engine's Core statements for DEFER
(``sqlmq.engines.sql.control``) and a new acquire. No peer: PGQueuer has no defer with
saved state.

    .venv/bin/python -m bench.defers [--db all] [--n 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from sqlmq import Message

from .common import DATABASES, QUEUE, bench_broker, table
from .run import standalone_args, standalone_footer

MESSAGES = 4


async def defers_per_second(db: str, n: int) -> float:
    async with bench_broker(db) as broker:
        done = asyncio.Event()
        runs = 0
        start = 0.0

        @broker.subscriber(QUEUE, workers=MESSAGES, flush_interval=0.0,
                           max_fetch_interval=0.01)
        async def handle(msg: Message) -> None:
            nonlocal runs, start
            if not runs:
                start = time.perf_counter()
            runs += 1
            if runs >= n:
                done.set()
                return
            await msg.defer(delay=0, state={"step": runs})

        await broker.publish_batch(QUEUE, range(MESSAGES))
        await broker.start()
        try:
            await asyncio.wait_for(done.wait(), 300)
            return (n - 1) / (time.perf_counter() - start)
        finally:
            await broker.stop()


async def main(args: argparse.Namespace) -> None:
    dbs = DATABASES if args.db == "all" else (args.db,)
    results: dict[str, list[float]] = {db: [] for db in dbs}
    for _ in range(args.rounds):
        for db in dbs:
            results[db].append(await defers_per_second(db, args.n))
    print(table(f"Messages deferring themselves, defers/s (median of {args.rounds} rounds of "
                f"{args.n} deliveries; {MESSAGES} messages, {MESSAGES} workers)",
                ["database", "defers/s", "rounds"],
                [(db, round(statistics.median(v)), " ".join(f"{x:.0f}" for x in v))
                 for db, v in results.items()]))
    print(standalone_footer("defers", args, "n"))


if __name__ == "__main__":
    asyncio.run(main(standalone_args(__doc__, "n", 400)))
