"""Where a limited channel's slot goes between two handlers (``python -m bench.slot_cycle
[--db all] [--channels 8] [--limit 2] [--per-channel 1000]``, its own module).

The channels case of ``bench.run`` drains 8 channels of ``max_concurrency=2`` with 10 ms
handlers; the sum of the limits is 1,600 msg/s, and a slot is busy for more than the
handler: its result's write, the wait for the next acquire, the acquire, and the hand-off
to a worker. This runs the same drain with the engine's ``acquire`` and ``settle`` timed
(on the broker's engine object, nothing else changed) and prints, per message, the medians
and means of each step of that cycle, and the cycle they add up to beside the one the
throughput implies (slots ÷ msg/s). A start passed on by the settle that freed its slot
(``engine.settle_passing``) is timed apart from the acquires: the settle is its acquire.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlmq import Message

from .common import DATABASES, QUEUE, drop_tables, fresh_broker, url_for
from .drain import publish_n

HANDLER_SECONDS = 0.01
WORKERS = 64


async def cycle(db: str, channels: int, limit: int, per_channel: int) -> dict[str, Any]:
    """One drain; the steps of the slot cycle in ms (median, mean) and the rate."""
    broker = await fresh_broker(db)
    sent: dict[int, float] = {}
    acquired: dict[int, float] = {}
    written: dict[int, float] = {}
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    engine = broker.engine
    acquire: Callable[..., Awaitable[Any]] = engine.acquire
    settle: Callable[..., Awaitable[set[int]]] = engine.settle

    async def timed_acquire(queues: Sequence[str], n: int, lease: float) -> Any:
        t0 = time.perf_counter()
        out = await acquire(queues, n, lease)
        t1 = time.perf_counter()
        for d in out:
            sent[d.id], acquired[d.id] = t0, t1
        return out

    async def timed_settle(batch: Sequence[Any]) -> set[int]:
        out = await settle(batch)
        t = time.perf_counter()
        for i in out:
            written[i] = t
        return out

    settle_passing: Callable[..., Awaitable[tuple[set[int], list[Any]]]] = (
        engine.settle_passing)
    passed: set[int] = set()

    async def timed_settle_passing(batch: Sequence[Any], *args: Any,
                                   ) -> tuple[set[int], list[Any]]:
        t0 = time.perf_counter()
        out, started_here = await settle_passing(batch, *args)
        t1 = time.perf_counter()
        for i in out:
            written[i] = t1
        for d in started_here:
            sent[d.id], acquired[d.id] = t0, t1
            passed.add(d.id)
        return out, started_here

    engine.acquire = timed_acquire  # type: ignore[method-assign]
    engine.settle = timed_settle  # type: ignore[method-assign]
    engine.settle_passing = timed_settle_passing  # type: ignore[method-assign]
    total = channels * per_channel
    try:
        await broker.set_channel_default(QUEUE, max_concurrency=limit)
        for i in range(channels):
            await publish_n(broker, per_channel, channel=f"c{i}")

        @broker.subscriber(QUEUE, workers=WORKERS, fetch_batch=WORKERS, prefetch=WORKERS,
                           flush_batch=1000, flush_interval=0.02)
        async def handle(msg: Message) -> None:
            started[msg.id] = time.perf_counter()
            await asyncio.sleep(HANDLER_SECONDS)
            ended[msg.id] = time.perf_counter()

        t0 = time.perf_counter()
        await broker.start()
        while len(ended) < total:
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - t0
        await broker.stop()
    finally:
        await broker.close()
        drop_tables(url_for(db))
    ids = sorted(ended)
    fetched = [i for i in ids if i not in passed]
    sends = sorted(set(t for i, t in sent.items() if i not in passed))

    def next_send(i: int) -> float | None:
        k = bisect.bisect_left(sends, written[i])
        return sends[k] - written[i] if k < len(sends) else None

    steps = {
        "handler": [ended[i] - started[i] for i in ids],
        "handler end -> result written": [written[i] - ended[i] for i in ids if i in written],
        "written -> next acquire sent": [w for i in ids if i in written
                                         if (w := next_send(i)) is not None],
        "acquire (sent -> returned)": [acquired[i] - sent[i] for i in fetched
                                       if i in acquired],
        "acquired -> handler start": [started[i] - acquired[i] for i in fetched
                                      if i in acquired],
        "passing settle (sent -> returned)": [acquired[i] - sent[i] for i in passed],
        "passed on -> handler start": [started[i] - acquired[i] for i in passed],
    }
    rate = total / elapsed
    return {"rate": rate, "implied": channels * limit / rate, "passed": len(passed) / total,
            "steps": {k: (1000 * statistics.median(v), 1000 * statistics.fmean(v))
                      for k, v in steps.items() if v}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", default="all")
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--per-channel", type=int, default=1000)
    args = parser.parse_args()
    dbs = DATABASES if args.db == "all" else tuple(args.db.split(","))
    asked = args.channels * args.limit / HANDLER_SECONDS
    for db in dbs:
        r = asyncio.run(cycle(db, args.channels, args.limit, args.per_channel))
        print(f"{db}: {r['rate']:,.0f} msg/s of {asked:,.0f} ({r['rate'] / asked:.0%}); "
              f"a slot's cycle {1000 * r['implied']:.1f} ms; {r['passed']:.0%} of the starts "
              f"passed on by the settle that freed their slot")
        for step, (p50, mean) in r["steps"].items():
            print(f"  {step:32} median {p50:6.2f} ms   mean {mean:6.2f} ms")
    print(f"reproduce: .venv/bin/python -m bench.slot_cycle --db {args.db} --channels "
          f"{args.channels} --limit {args.limit} --per-channel {args.per_channel}")


if __name__ == "__main__":
    main()
