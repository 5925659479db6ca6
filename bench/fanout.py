"""Fanout: a topic publish to ``GROUPS`` consumer groups and their drain, next to the plain
publish and drain of one queue, in the same run, on each database.

Fanout is on write (see :mod:`sqlmq.topics`): a topic publish writes a row per group, and
each group drains its own queue with the ordinary acquire and settle. So the cost to
measure is the copies: publishing a message to 10 groups writes 10 rows, and draining
them is 10 ordinary drains sharing one database. The figures:

* publish: messages/s of ``publish_topic_batch`` (batches of ``CHUNK``), and the copies/s
  that makes, against ``publish_batch`` of the same messages to one queue;
* drain: copies/s archived by one subscriber per group in one process (all groups at once),
  and the messages/s each group saw, against one subscriber draining one queue.

PGQueuer has no topics or fanout, so no peer runs here.

    .venv/bin/python -m bench.fanout [ROUNDS] [MESSAGES]
"""

from __future__ import annotations

import asyncio
import sys
import time

from sqlmq import Broker

from .common import DATABASES, PAYLOAD, PREFIX, QUEUE, bench_broker, median, table
from .drain import SQLMQ_DRAIN, analyze, until_completed

GROUPS = 10
TOPIC = "bench.created"
CHUNK = 1000


async def _drain(broker: Broker, copies: int) -> float:
    """Seconds from start() until the subscribers completed ``copies`` messages."""
    elapsed = await until_completed(broker, copies)
    await broker.stop()
    return elapsed


async def plain(db: str, n: int) -> tuple[float, float]:
    """(publish msgs/s, drain msgs/s) of one queue."""
    async with bench_broker(db) as broker:
        start = time.perf_counter()
        for i in range(0, n, CHUNK):
            await broker.publish_batch(QUEUE, [PAYLOAD] * min(CHUNK, n - i))
        published = n / (time.perf_counter() - start)
        await analyze(broker)

        @broker.subscriber(QUEUE, **SQLMQ_DRAIN)
        async def handle(body: bytes) -> None:
            pass

        return published, n / await _drain(broker, n)


async def fanout(db: str, n: int) -> tuple[float, float]:
    """(publish msgs/s, drain copies/s) of a topic with ``GROUPS`` groups."""
    async with bench_broker(db) as broker:
        for g in range(GROUPS):
            await broker.join_group(TOPIC, f"group{g}")
        start = time.perf_counter()
        for i in range(0, n, CHUNK):
            fan = await broker.publish_topic_batch(TOPIC, [PAYLOAD] * min(CHUNK, n - i))
            assert len(fan) == GROUPS
        published = n / (time.perf_counter() - start)
        await analyze(broker)
        for g in range(GROUPS):
            @broker.subscriber(topic=TOPIC, group=f"group{g}", **SQLMQ_DRAIN)
            async def handle(body: bytes) -> None:
                pass

        return published, n * GROUPS / await _drain(broker, n * GROUPS)


async def main(rounds: int, n: int) -> None:
    rows = []
    for db in DATABASES:
        plains = [await plain(db, n) for _ in range(rounds)]
        fans = [await fanout(db, n) for _ in range(rounds)]
        p_pub, p_drain = median([p for p, _ in plains]), median([d for _, d in plains])
        f_pub, f_drain = median([p for p, _ in fans]), median([d for _, d in fans])
        rows.append((db, "one queue", round(p_pub), round(p_pub), round(p_drain),
                     round(p_drain)))
        rows.append((db, f"topic, {GROUPS} groups", round(f_pub), round(f_pub * GROUPS),
                     round(f_drain), round(f_drain / GROUPS)))
    print(table(f"Fanout on write: {n} messages, median of {rounds} rounds",
                ["database", "to", "publish msgs/s", "rows written/s", "drain rows/s",
                 "drain msgs/s per group"], rows))
    print(f"\nreproduce: .venv/bin/python -m bench.fanout {rounds} {n}")
    print(f"(tables {PREFIX}*: dropped after each case)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3,
                     int(sys.argv[2]) if len(sys.argv) > 2 else 5000))
