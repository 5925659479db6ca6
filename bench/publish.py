"""Publish: single publishes (one transaction each, awaited one after another) and batch
publishes (``publish_batch``, one transaction per batch), in messages per second. Batches are
timed at two sizes: 5,000 per call and 50,000 per call (on PostgreSQL both go by binary COPY,
where the larger one spreads the fixed cost of a call over more rows)."""

from __future__ import annotations

import time

from .common import PAYLOAD, QUEUE, drop_tables, fresh_broker, url_for

SINGLE_COUNT = 3000
BATCH_SIZE = 5000
LARGE_BATCH_SIZE = 50_000


async def publish_single(db: str, count: int = SINGLE_COUNT) -> float:
    broker = await fresh_broker(db)
    try:
        await broker.publish(QUEUE, PAYLOAD)  # connect and prepare outside the clock
        start = time.perf_counter()
        for _ in range(count):
            await broker.publish(QUEUE, PAYLOAD)
        return count / (time.perf_counter() - start)
    finally:
        await broker.close()
        drop_tables(url_for(db))


async def publish_batches(db: str, total: int, batch: int = BATCH_SIZE) -> float:
    broker = await fresh_broker(db)
    try:
        bodies = [PAYLOAD] * batch
        await broker.publish_batch(QUEUE, bodies[:1000])  # connect and prepare (COPY too)
        start = time.perf_counter()
        sent = 0
        while sent < total:
            sent += len(await broker.publish_batch(QUEUE, bodies[: min(batch, total - sent)]))
        return sent / (time.perf_counter() - start)
    finally:
        await broker.close()
        drop_tables(url_for(db))
