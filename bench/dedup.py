"""Deduplication keys: what a key costs a publish, in messages per second, next to the
same publish without one, on each database; PGQueuer's ``dedupe_key`` beside it on
PostgreSQL. Three ways per publish style:

* plain: no key;
* keyed: a new key each message (everything is written);
* duplicate: keys already held (nothing is written; each publish returns the holder's id).

Single publishes are awaited one after another (one transaction each); batches are
``publish_batch`` calls of ``BATCH`` messages. On MariaDB, which has no partial index, the
unique index costs unkeyed publishes too: ``plain without the index`` is the plain single
publish with ``ux_…_dedup`` dropped, in the same run.

    .venv/bin/python -m bench.dedup [ROUNDS]
"""

from __future__ import annotations

import asyncio
import sys

from sqlmq import Broker

from .common import (
    DATABASES,
    PAYLOAD,
    PEER_PREFIX,
    PREFIX,
    QUEUE,
    drop_tables,
    fresh_broker,
    fresh_peer_schema,
    median,
    peer,
    table,
    url_for,
)

SINGLE = 2000
BATCH = 1000
BATCHES = 20


async def _timed_singles(broker: Broker, keys: list[str | None]) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    for key in keys:
        await broker.publish(QUEUE, PAYLOAD, dedup_key=key)
    return len(keys) / (loop.time() - start)


async def _timed_batches(broker: Broker, keys: list[list[str] | None]) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    for chunk in keys:
        await broker.publish_batch(QUEUE, [PAYLOAD] * BATCH, dedup_keys=chunk)
    return BATCH * len(keys) / (loop.time() - start)


async def single(db: str, way: str, *, drop_index: bool = False) -> float:
    broker = await fresh_broker(db)
    try:
        if drop_index:
            m = broker.schema.message.name
            async with broker.db.begin() as conn:
                await conn.exec_driver_sql(f"DROP INDEX ux_{m}_dedup ON {m}")
        keys: list[str | None] = [f"key-{i}" for i in range(SINGLE)]
        if way == "duplicate":
            await broker.publish_batch(QUEUE, [PAYLOAD] * SINGLE, dedup_keys=keys)
        await broker.publish(QUEUE, PAYLOAD, dedup_key="warm-up")
        await broker.publish(QUEUE, PAYLOAD)  # connect and prepare outside the clock
        return await _timed_singles(broker, [None] * SINGLE if way == "plain" else keys)
    finally:
        await broker.close()
        drop_tables(url_for(db))


async def batches(db: str, way: str) -> float:
    broker = await fresh_broker(db)
    try:
        keys = [[f"key-{b}-{i}" for i in range(BATCH)] for b in range(BATCHES)]
        if way == "duplicate":
            for chunk in keys:
                await broker.publish_batch(QUEUE, [PAYLOAD] * BATCH, dedup_keys=chunk)
        await broker.publish_batch(QUEUE, [PAYLOAD] * BATCH, dedup_keys=["w"] * BATCH)
        await broker.publish_batch(QUEUE, [PAYLOAD] * BATCH)
        return await _timed_batches(broker, [None] * BATCHES if way == "plain" else keys)
    finally:
        await broker.close()
        drop_tables(url_for(db))


async def main(rounds: int) -> None:
    ways = ("plain", "keyed", "duplicate")
    results: dict[tuple[str, str, str], list[float]] = {}

    def add(db: str, style: str, way: str, value: float) -> None:
        results.setdefault((db, style, way), []).append(value)

    for _ in range(rounds):
        for db in DATABASES:
            for way in ways:
                add(db, "single", way, await single(db, way))
                add(db, "batch", way, await batches(db, way))
            if db == "mariadb":
                add(db, "single", "plain without the index",
                    await single(db, "plain", drop_index=True))
        for way in ways:
            fresh_peer_schema()
            add("pgqueuer", "single", way, peer("enqueue", SINGLE, way)["rate"])
            peer("uninstall")

    rows = []
    for (db, style, way), values in results.items():
        plain = median(results[db, style, "plain"])
        rate = median(values)
        rows.append((db, style, way, round(rate), f"{rate / plain:.2f}"))
    print(table(f"Publish with deduplication keys, msgs/s (median of {rounds} rounds; "
                f"single: {SINGLE} awaited one by one; batch: {BATCHES} x {BATCH})",
                ["database", "publish", "way", "msgs/s", "vs plain"], rows))
    print(f"\nreproduce: .venv/bin/python -m bench.dedup {rounds}")
    print(f"(tables {PREFIX}*, peer {PEER_PREFIX}*: dropped after each case)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
