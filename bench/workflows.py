"""Workflows: the drain of a ``--n``-step workflow (``n / 2`` pairs, the second step of
each after the first) beside the drain of ``--n`` plain messages, on each database, in
messages per second, the two alternating within a round, the order flipped every round;
and the time from a dependency's settle to its dependent's start (the dependency's
``archived_at`` to the dependent's first acquire, both on the database's clock), over 200
two-step workflows published one after another to a running subscriber with its defaults.

    .venv/bin/python -m bench.workflows [--db all] [--n 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from sqlalchemy import select

from sqlmq import Broker

from .common import DATABASES, PAYLOAD, QUEUE, bench_broker, table
from .drain import SQLMQ_DRAIN, completed_rate, preload
from .run import standalone_args, standalone_footer

#: Two-step workflows the release latency is measured over.
PAIRS = 200


async def publish_pairs(broker: Broker, n: int) -> float:
    """One workflow of ``n`` steps in ``n / 2`` pairs; the seconds its publish took."""
    start = time.perf_counter()
    flow = broker.workflow("bench")
    for i in range(n // 2):
        first = flow.add(QUEUE, PAYLOAD, name=f"a{i}")
        flow.add(QUEUE, PAYLOAD, name=f"b{i}", after=[first])
    await flow.publish()
    return time.perf_counter() - start


async def drain_rate(db: str, n: int, steps: bool) -> tuple[float, float]:
    """Messages per second from start() until all ``n`` are archived, and the seconds their
    publish took."""
    async with bench_broker(db) as broker:
        if steps:
            published = await publish_pairs(broker, n)
        else:
            published = await preload(broker, n)

        @broker.subscriber(QUEUE, **SQLMQ_DRAIN)
        async def handle(body: bytes) -> None:
            pass

        return await completed_rate(broker, n), published


async def release_latency(db: str) -> list[float]:
    """Milliseconds from each first step's settle to its second step's start."""
    async with bench_broker(db) as broker:
        @broker.subscriber(QUEUE)  # the defaults a user writes
        async def handle(body: bytes) -> None:
            pass

        await broker.start()
        pairs = []
        for i in range(PAIRS):
            flow = broker.workflow(f"pair-{i}")
            first = flow.add(QUEUE, PAYLOAD, name="a")
            flow.add(QUEUE, PAYLOAD, name="b", after=[first])
            ids = await flow.publish()
            pairs.append((ids["a"], ids["b"]))
            await asyncio.sleep(0.01)
        a = broker.schema.archive
        while True:
            async with broker.db.connect() as conn:
                found = {r.id: r for r in await conn.execute(
                    select(a.c.id, a.c.archived_at, a.c.first_attempt_at))}
            if len(found) == 2 * PAIRS:
                break
            await asyncio.sleep(0.05)
        await broker.stop()
    return [(found[b].first_attempt_at - found[x].archived_at).total_seconds() * 1000
            for x, b in pairs]


def _ms(values: list[float], q: float) -> str:
    return f"{statistics.quantiles(values, n=100)[int(q) - 1]:.2f}"


async def main(args: argparse.Namespace) -> None:
    dbs = DATABASES if args.db == "all" else (args.db,)
    rates: dict[tuple[str, bool], list[float]] = {}
    publishes: dict[tuple[str, bool], list[float]] = {}
    for r in range(args.rounds):
        for db in dbs:
            for steps in ((False, True) if r % 2 == 0 else (True, False)):
                rate, published = await drain_rate(db, args.n, steps)
                rates.setdefault((db, steps), []).append(rate)
                publishes.setdefault((db, steps), []).append(published)
                print(f"round {r + 1}: {db} {'workflow' if steps else 'plain'} {rate:.0f} "
                      f"msg/s (published in {published:.1f} s)", file=sys.stderr, flush=True)
    rows: list[Any] = []
    for db in dbs:
        plain, flow = rates[(db, False)], rates[(db, True)]
        rows.append((db, round(statistics.median(plain)), round(statistics.median(flow)),
                     f"{statistics.median(flow) / statistics.median(plain):.2f}",
                     f"{statistics.median(publishes[(db, False)]):.2f}",
                     f"{statistics.median(publishes[(db, True)]):.2f}",
                     " ".join(f"{x:.0f}" for x in plain), " ".join(f"{x:.0f}" for x in flow)))
    print(table(f"Drain of {args.n} messages: plain, or a workflow of {args.n // 2} pairs, "
                f"msg/s (median of {args.rounds} rounds; {SQLMQ_DRAIN})",
                ["database", "plain", "workflow", "workflow/plain", "publish s (plain)",
                 "publish s (workflow)", "plain rounds", "workflow rounds"], rows))
    latency = []
    for db in dbs:
        ms = await release_latency(db)
        latency.append((db, _ms(ms, 50), _ms(ms, 90), _ms(ms, 99), f"{max(ms):.2f}"))
    print(table(f"From a dependency's settle to its dependent's start, ms ({PAIRS} two-step "
                f"workflows, a subscriber with its defaults)",
                ["database", "p50", "p90", "p99", "max"], latency))
    print(standalone_footer("workflows", args, "n"))


if __name__ == "__main__":
    asyncio.run(main(standalone_args(__doc__, "n", 10_000)))
