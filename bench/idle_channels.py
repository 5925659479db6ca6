"""What idle limited channels cost an acquire, and what forgetting them gives back
(``python -m bench.idle_channels [--db all] [--idle 20000]``, its own module).

A queue default of ``max_concurrency=2`` makes every channel limited, as per-tenant limits
do. ``--idle`` channels each get one message, handled, so their rows stay with nothing in
them; four live channels then get ten messages each, and five acquires of 8 are timed.
Three runs per database: with no idle channel, with the idle ones, and with the idle ones
forgotten first (``engine.forget_idle_channels``, what the leader's sweep does after an
hour). No peer has this feature's shape, so none is compared.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import timedelta

from sqlmq.lifecycle import Outcome
from sqlmq.records import Settlement

from .common import DATABASES, QUEUE, drop_tables, fresh_broker, url_for
from .drain import analyze


async def acquire_ms(db: str, idle: int, forget: bool) -> tuple[float, float]:
    """Median ms of five acquires of 8 from four live channels beside ``idle`` idle ones;
    and the seconds the forgetting took (0 without it)."""
    broker = await fresh_broker(db)
    try:
        await broker.set_channel_default(QUEUE, max_concurrency=2)
        engine = broker.engine
        for i in range(idle):
            await broker.publish(QUEUE, b"x", channel=f"idle{i}")
        while got := await engine.acquire([QUEUE], 500, 300):
            await engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE) for d in got])
        took = 0.0
        if forget:
            started = time.perf_counter()
            cut = await engine.now() + timedelta(seconds=1)
            while await engine.forget_idle_channels(cut, 1000):
                pass
            took = time.perf_counter() - started
        await analyze(broker)
        for i in range(4):
            await broker.publish_batch(QUEUE, [b"y"] * 10, channel=f"live{i}")
        times = []
        for _ in range(5):
            started = time.perf_counter()
            got = await engine.acquire([QUEUE], 8, 300)
            times.append(1000 * (time.perf_counter() - started))
            await engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE) for d in got])
        return statistics.median(times), took
    finally:
        await broker.close()
        drop_tables(url_for(db))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--db", default="all", choices=[*DATABASES, "all"])
    p.add_argument("--idle", type=int, default=20000)
    args = p.parse_args()
    print(f"acquire of 8 from 4 live limited channels, median of 5 (ms), beside "
          f"{args.idle:,} idle limited channels")
    print(f"{'database':<11} {'no idle':>8} {'idle':>8} {'forgotten':>10} {'forget took':>12}")
    for db in DATABASES if args.db == "all" else [args.db]:
        none, _ = asyncio.run(acquire_ms(db, 0, False))
        kept, _ = asyncio.run(acquire_ms(db, args.idle, False))
        gone, took = asyncio.run(acquire_ms(db, args.idle, True))
        print(f"{db:<11} {none:8.1f} {kept:8.1f} {gone:10.1f} {took:11.2f}s", flush=True)
    print(f"\nreproduce: .venv/bin/python -m bench.idle_channels --db {args.db} "
          f"--idle {args.idle}")


if __name__ == "__main__":
    main()
