"""Pipeline hop throughput: one step that reads a queue and publishes each message's result
to the next, on each database, in the same run as the plain drain it builds on.

Three ways to drain ``MESSAGES`` preloaded messages with one subscriber (``SQLMQ_DRAIN``):

* ``drain``: the handler returns nothing: the plain drain, for reference;
* ``publish in the handler``: the handler awaits ``broker.publish("out", body)``, which is
  what a step looks like on a broker without pipelines: a transaction per output, and not
  atomic (a crash between that publish and the settle publishes the output twice);
* ``publish_to``: the handler returns the body and ``publish_to="out"`` publishes it in the
  transaction that archives the input (one insert per flush), exactly-once across a crash.

Each figure is hops/s: inputs archived, with their outputs written, per second from
``start()``. No peer runs here: PGQueuer has no pipelines, and its step would be the
second way.

    .venv/bin/python -m bench.pipeline [ROUNDS] [MESSAGES]
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from .common import DATABASES, PREFIX, QUEUE, bench_broker, median, table
from .drain import SQLMQ_DRAIN, analyze, preload, until_completed

OUT = "bench-out"
WAYS = ("drain", "publish in the handler", "publish_to")


async def hop(db: str, n: int, way: str) -> float:
    """Hops/s of one way on one database."""
    async with bench_broker(db) as broker:
        await preload(broker, n)
        await analyze(broker)
        onward: dict[str, Any] = {"publish_to": OUT} if way == "publish_to" else {}

        @broker.subscriber(QUEUE, **SQLMQ_DRAIN, **onward)
        async def step(body: bytes) -> bytes | None:
            if way == "publish in the handler":
                await broker.publish(OUT, body)
            return body if way == "publish_to" else None

        seconds = await until_completed(broker, n)
        await broker.stop()
        outputs = {s.queue: s.pending for s in await broker.stats()}.get(OUT, 0)
        assert outputs == (0 if way == "drain" else n), f"{outputs} outputs for {n} inputs"
        return n / seconds


async def main(rounds: int, n: int) -> None:
    rows = []
    for db in DATABASES:
        rates = {way: median([await hop(db, n, way) for _ in range(rounds)]) for way in WAYS}
        rows.append((db, *(round(rates[w]) for w in WAYS)))
    print(table(f"Pipeline hops/s: {n} messages, one subscriber, median of {rounds} rounds",
                ["database", *WAYS], rows))
    print(f"\nreproduce: .venv/bin/python -m bench.pipeline {rounds} {n}")
    print(f"(tables {PREFIX}*: dropped after each case)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3,
                     int(sys.argv[2]) if len(sys.argv) > 2 else 5000))
