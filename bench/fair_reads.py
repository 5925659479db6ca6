"""What one fair acquire costs, in three states of 1,000 channels of 20 messages each
(``python -m bench.fair_reads [--db all] [--repeat 10]``, its own module): an acquire of
500 from channels without limits (each takes 500); from ordered channels with every head
free (it takes 500 heads); and from ordered channels with every head running, where it
reads each of their 19,000 followers to refuse it and takes nothing. Medians of
``--repeat`` calls of ``engine.acquire``, in ms. The third is what a drain of ordered
channels pays whenever most heads are in a buffer or a handler (see bench/README). No
peer has ordered channels, so none is compared.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from .channels import _publish_spread
from .common import DATABASES, QUEUE, bench_broker
from .drain import analyze

CHANNELS = 1000
MESSAGES = 20_000
TAKE = 500


async def acquire_ms(db: str, ordered: bool, running: bool, repeat: int) -> float:
    """Median ms of ``repeat`` acquires of :data:`TAKE` in one of the three states."""
    async with bench_broker(db) as broker:
        if ordered:
            await broker.set_channel_default(QUEUE, ordered=True)
        await _publish_spread(broker, MESSAGES, CHANNELS)
        await analyze(broker)
        engine = broker.engine
        if running:
            assert len(await engine.acquire([QUEUE], CHANNELS, 300)) == CHANNELS
        expected = 0 if running else TAKE
        times = []
        for _ in range(repeat if not ordered or running else 1):
            started = time.perf_counter()
            got = await engine.acquire([QUEUE], TAKE, 300)
            times.append(1000 * (time.perf_counter() - started))
            if len(got) != expected:
                raise RuntimeError(f"an acquire took {len(got)}, not {expected}")
        return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--db", default="all", choices=[*DATABASES, "all"])
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args()
    print(f"one acquire of {TAKE} from {CHANNELS:,} channels of {MESSAGES // CHANNELS} (ms; "
          f"median of {args.repeat}, the ordered heads' of one: the second would find "
          f"them taken)")
    print(f"{'database':<11} {'no limits':>10} {'ordered, heads free':>20} "
          f"{'ordered, heads running':>23}")
    for db in DATABASES if args.db == "all" else [args.db]:
        spread = asyncio.run(acquire_ms(db, False, False, args.repeat))
        heads = asyncio.run(acquire_ms(db, True, False, args.repeat))
        refused = asyncio.run(acquire_ms(db, True, True, args.repeat))
        print(f"{db:<11} {spread:10.1f} {heads:20.1f} {refused:23.1f}", flush=True)
    print(f"\nreproduce: .venv/bin/python -m bench.fair_reads --db {args.db} "
          f"--repeat {args.repeat}")


if __name__ == "__main__":
    main()
