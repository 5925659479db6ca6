"""A publishing process for the deduplication test: publishes every key of a range, in
an order of its own, as single publishes, batches and publishes in its own transactions
(the outbox), and writes what each publish returned as JSON lines ``[key, id, duplicate]``.

Run as ``python -m tests.dedup_publisher URL PREFIX SEED KEYS OUT``; a line ``ready`` on
stdout, then it waits for a line on stdin, so that all publishers start together.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys

from sqlalchemy.exc import DBAPIError

from sqlmq import Broker, Published

QUEUE = "dedup"


async def main(url: str, prefix: str, seed: int, count: int, out: str) -> None:
    rng = random.Random(seed)
    keys = [f"key-{i}" for i in range(count)]
    rng.shuffle(keys)
    broker = Broker(url, table_prefix=prefix)
    results: list[tuple[str, int, bool]] = []
    try:
        await broker.check_schema()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        i = 0
        while i < len(keys):
            way, size = rng.choice(["one", "batch", "outbox"]), rng.randint(1, 20)
            chunk = keys[i : i + size] if way != "one" else keys[i : i + 1]
            i += len(chunk)
            if way == "one":
                got = [await broker.publish(QUEUE, chunk[0], dedup_key=chunk[0])]
            elif way == "batch":
                got = await broker.publish_batch(QUEUE, chunk, dedup_keys=chunk)
            else:
                got = await in_own_transaction(broker, chunk)
            for key, msg_id in zip(chunk, got, strict=True):
                assert isinstance(msg_id, Published), msg_id
                results.append((key, int(msg_id), msg_id.duplicate))
    finally:
        await broker.close()
        with open(out, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


async def in_own_transaction(broker: Broker, chunk: list[str]) -> list[int]:
    """An outbox publish, run again when MariaDB picks it as a deadlock's victim, as the
    docs tell a caller to (docs/routing.md)."""
    for _ in range(10):
        try:
            async with broker.db.begin() as conn:
                return await broker.publish_batch(QUEUE, chunk, dedup_keys=chunk,
                                                  connection=conn)
        except DBAPIError as exc:
            if getattr(exc.orig, "args", (None,))[0] != 1213:
                raise
            print("deadlock: running the transaction again", file=sys.stderr)
    raise RuntimeError("ten deadlocks in a row")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)  # sqlmq's account of deadlocks run again
    url, prefix, seed, count, out = sys.argv[1:]
    asyncio.run(main(url, prefix, int(seed), int(count), out))
