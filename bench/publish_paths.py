"""What a single publish costs by the way it is made, in milliseconds (median per publish,
awaited one after another; each case on fresh tables):

* ``own``: ``broker.publish(queue, body)``, sqlmq's own transaction (the engines' fast
  path, one statement);
* ``caller's transaction``: the same inside ``async with broker.db.begin()`` (the outbox:
  the BEGIN and COMMIT are in the figure);
* ``dedup key``: a new key each publish;
* ``channel``: to one of 100 channels without limits; ``channel, caller's transaction``
  the same inside the caller's transaction;
* ``ordered channel`` and ``limited channel``: the queue's channel default ``ordered=True``,
  then ``max_concurrency=2``;
* ``max_size channel, 20,000 waiting``: to one channel with ``max_size=1,000,000`` that
  holds 20,000 messages (a publish checks the size against the channel's size bound, and
  counts the channel's messages only when it may not fit).

All but the first go through SQLAlchemy Core (``sqlmq.engines.sql.publish`` and
``core_room``), where the Python side of a publish, not its SQL, was most of the time.
PGQueuer's single enqueue is in ``bench.run publish``.

    .venv/bin/python -m bench.publish_paths [--db all] [--count 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from sqlmq import Broker

from .common import DATABASES, PAYLOAD, QUEUE, bench_broker, table
from .run import standalone_args, standalone_footer

Publish = Callable[[Broker, int], Awaitable[object]]


async def _own(broker: Broker, i: int) -> object:
    return await broker.publish(QUEUE, PAYLOAD)


async def _outbox(broker: Broker, i: int) -> object:
    async with broker.db.begin() as conn:
        return await broker.publish(QUEUE, PAYLOAD, connection=conn)


async def _dedup(broker: Broker, i: int) -> object:
    return await broker.publish(QUEUE, PAYLOAD, dedup_key=f"k{i}")


async def _channel(broker: Broker, i: int) -> object:
    return await broker.publish(QUEUE, PAYLOAD, channel=f"c{i % 100}")


async def _channel_outbox(broker: Broker, i: int) -> object:
    async with broker.db.begin() as conn:
        return await broker.publish(QUEUE, PAYLOAD, channel=f"c{i % 100}", connection=conn)


async def _to_full_channel(broker: Broker, i: int) -> object:
    return await broker.publish(QUEUE, PAYLOAD, channel="sized")


async def _no_setup(broker: Broker) -> None:
    pass


def _default(**settings: object) -> Callable[[Broker], Awaitable[None]]:
    async def setup(broker: Broker) -> None:
        await broker.set_channel_default(QUEUE, **settings)  # type: ignore[arg-type]
    return setup


async def _sized_backlog(broker: Broker) -> None:
    await broker.set_channel("sized", max_size=1_000_000, queue=QUEUE)
    for _ in range(BACKLOG // 5000):
        await broker.publish_batch(QUEUE, [PAYLOAD] * 5000, channel="sized")


#: Messages waiting in the ``max_size`` case's channel.
BACKLOG = 20_000
#: (case, what runs before it, the publish)
CASES: list[tuple[str, Callable[[Broker], Awaitable[None]], Publish]] = [
    ("own", _no_setup, _own),
    ("caller's transaction", _no_setup, _outbox),
    ("dedup key", _no_setup, _dedup),
    ("channel", _no_setup, _channel),
    ("channel, caller's transaction", _no_setup, _channel_outbox),
    ("ordered channel", _default(ordered=True), _channel),
    ("limited channel", _default(max_concurrency=2), _channel),
    (f"max_size channel, {BACKLOG:,} waiting", _sized_backlog, _to_full_channel),
]


async def per_publish(db: str, setup: Callable[[Broker], Awaitable[None]],
                      publish: Publish, count: int) -> float:
    """Median milliseconds of ``count`` publishes, after 20 unclocked ones (connections,
    prepared statements, SQLAlchemy's compiled cache)."""
    async with bench_broker(db) as broker:
        await setup(broker)
        for i in range(20):
            await publish(broker, -1 - i)
        times = []
        for i in range(count):
            start = time.perf_counter()
            await publish(broker, i)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1000


async def main(args: argparse.Namespace) -> None:
    dbs = DATABASES if args.db == "all" else (args.db,)
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for db in dbs:
            for name, setup, publish in CASES:
                results.setdefault((db, name), []).append(
                    await per_publish(db, setup, publish, args.count))
    rows = [(db, name, f"{statistics.median(v):.2f}",
             f"{statistics.median(v) / statistics.median(results[db, 'own']):.1f}")
            for (db, name), v in results.items()]
    print(table(f"A single publish by the way it is made, ms (median per publish of "
                f"{args.count}, median of {args.rounds} rounds)",
                ["database", "publish", "ms", "vs own"], rows))
    print(standalone_footer("publish_paths", args, "count"))


if __name__ == "__main__":
    asyncio.run(main(standalone_args(__doc__, "count", 400)))
