"""Batch handlers: a drain of ``--n`` messages by a batch handler (``batch=500``, a list per
call) beside the plain drain (one message per call) of ``bench.drain``, on each database,
in messages per second. Both with ``bench.drain``'s settings and a no-op handler; the two
alternate within a round, the order flipped every round, so load on the machine falls on
both alike.

    .venv/bin/python -m bench.batches [--db all] [--n 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from typing import Any

from .common import DATABASES, QUEUE, bench_broker, table
from .drain import SQLMQ_DRAIN, completed_rate, preload
from .run import standalone_args, standalone_footer

BATCH = {"batch": 500, "batch_wait": 0.02}


async def drain_rate(db: str, n: int, batched: bool) -> float:
    """Messages per second from start() until all ``n`` preloaded messages are archived."""
    async with bench_broker(db) as broker:
        await preload(broker, n)
        if batched:
            @broker.subscriber(QUEUE, **SQLMQ_DRAIN, **BATCH)
            async def handle_batch(bodies: list[bytes]) -> None:
                pass
        else:
            @broker.subscriber(QUEUE, **SQLMQ_DRAIN)
            async def handle(body: bytes) -> None:
                pass
        return await completed_rate(broker, n)


async def main(args: argparse.Namespace) -> None:
    dbs = DATABASES if args.db == "all" else (args.db,)
    rates: dict[tuple[str, bool], list[float]] = {}
    for r in range(args.rounds):
        for db in dbs:
            for batched in ((False, True) if r % 2 == 0 else (True, False)):
                rate = await drain_rate(db, args.n, batched)
                rates.setdefault((db, batched), []).append(rate)
                print(f"round {r + 1}: {db} {'batch' if batched else 'plain'} {rate:.0f} msg/s",
                      file=sys.stderr, flush=True)
    rows: list[Any] = []
    for db in dbs:
        plain, batch = rates[(db, False)], rates[(db, True)]
        rows.append((db, round(statistics.median(plain)), round(statistics.median(batch)),
                     f"{statistics.median(batch) / statistics.median(plain):.2f}",
                     " ".join(f"{x:.0f}" for x in plain), " ".join(f"{x:.0f}" for x in batch)))
    print(table(f"Drain of {args.n} messages, msg/s (median of {args.rounds} rounds; "
                f"{SQLMQ_DRAIN}; batch: {BATCH})",
                ["database", "plain", "batch", "batch/plain", "plain rounds", "batch rounds"],
                rows))
    print(standalone_footer("batches", args, "n"))


if __name__ == "__main__":
    asyncio.run(main(standalone_args(__doc__, "n", 100_000)))
