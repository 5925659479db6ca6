"""PGQueuer, the peer, measured the way bench/ measures sqlmq.

Runs with the benchmark's own interpreter (``bench/.venv-pgqueuer/bin/python``, made by
``bench/setup.sh``) and never imports sqlmq, so neither project's packages leak into the
other. Every object PGQueuer creates is named with ``PGQUEUER_PREFIX`` (set by the caller)
and dropped by ``uninstall``.

Roles (one JSON line on stdout each):
  install | uninstall
  preload N              enqueue N 64-byte jobs in batches
  work N BATCH           run one QueueManager until N jobs are done (drain mode)
  consume N BATCH SECS   run one QueueManager until N jobs came, record publish->handler-start
  publish RATE SECONDS   enqueue one job per transaction at a steady rate
  enqueue N WAY          enqueue N jobs one at a time, WAY: plain, keyed (new dedupe keys)
                         or duplicate (keys already queued, skipped)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import timedelta

import asyncpg
from pacing import latency_of, paced  # bench/pacing.py: this script runs from bench/
from pgqueuer import QueueManager
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
ENTRYPOINT = "bench"
PAYLOAD = b"x" * 64


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def install() -> None:
    conn = await asyncpg.connect(DSN)
    try:
        await Queries.from_asyncpg_connection(conn).install()
    finally:
        await conn.close()
    emit(ok=True)


async def uninstall() -> None:
    conn = await asyncpg.connect(DSN)
    try:
        await Queries.from_asyncpg_connection(conn).uninstall()
    finally:
        await conn.close()
    emit(ok=True)


async def preload(n: int) -> None:
    conn = await asyncpg.connect(DSN)
    q = Queries.from_asyncpg_connection(conn)
    start = time.perf_counter()
    for i in range(0, n, 5000):
        k = min(5000, n - i)
        await q.enqueue([ENTRYPOINT] * k, [PAYLOAD] * k, [0] * k)
    await conn.execute(f"ANALYZE {os.environ.get('PGQUEUER_PREFIX', '')}pgqueuer")
    await conn.close()
    emit(seconds=time.perf_counter() - start)


async def work(n: int, batch_size: int) -> None:
    conn = await asyncpg.connect(DSN)
    qm = QueueManager(Queries.from_asyncpg_connection(conn))
    done = 0

    @qm.entrypoint(ENTRYPOINT)
    async def handle(job: Job) -> None:
        nonlocal done
        done += 1

    start = time.perf_counter()
    # drain mode returns once the queue is empty and the status log is flushed.
    await qm.run(batch_size=batch_size, mode=QueueExecutionMode.drain,
                 dequeue_timeout=timedelta(seconds=0.05))
    elapsed = time.perf_counter() - start
    await conn.close()
    emit(seconds=elapsed, handled=done)


async def consume(expected: int, batch_size: int, timeout: float) -> None:
    conn = await asyncpg.connect(DSN)
    qm = QueueManager(Queries.from_asyncpg_connection(conn))
    latencies: list[float] = []

    @qm.entrypoint(ENTRYPOINT)
    async def handle(job: Job) -> None:
        assert job.payload is not None
        latencies.append(latency_of(job.payload))
        if len(latencies) >= expected:
            qm.shutdown.set()

    loop = asyncio.get_running_loop()
    loop.call_later(1.0, lambda: emit(ready=True))  # once the LISTEN is in place
    loop.call_later(timeout, qm.shutdown.set)
    await qm.run(batch_size=batch_size, dequeue_timeout=timedelta(seconds=30))
    await conn.close()
    emit(latencies=latencies)


async def publish(rate: float, seconds: float) -> None:
    pool = await asyncpg.create_pool(DSN, min_size=8, max_size=32)
    q = Queries.from_asyncpg_pool(pool)
    achieved = await paced(rate, seconds, lambda p: q.enqueue(ENTRYPOINT, p))
    await pool.close()
    emit(rate=achieved)


async def enqueue(n: int, way: str) -> None:
    conn = await asyncpg.connect(DSN)
    q = Queries.from_asyncpg_connection(conn)
    keys = [f"key-{i}" for i in range(n)]
    if way == "duplicate":
        await q.enqueue([ENTRYPOINT] * n, [PAYLOAD] * n, [0] * n, dedupe_key=list(keys))
    await q.enqueue(ENTRYPOINT, PAYLOAD)  # connected and prepared outside the clock
    start = time.perf_counter()
    for key in keys:
        if way == "plain":
            await q.enqueue(ENTRYPOINT, PAYLOAD)
        else:
            await q.enqueue(ENTRYPOINT, PAYLOAD, dedupe_key=key, on_conflict="skip")
    elapsed = time.perf_counter() - start
    await conn.close()
    emit(rate=n / elapsed)


def main(argv: list[str]) -> None:
    role, args = argv[0], argv[1:]
    if role == "install":
        coro = install()
    elif role == "uninstall":
        coro = uninstall()
    elif role == "preload":
        coro = preload(int(args[0]))
    elif role == "work":
        coro = work(int(args[0]), int(args[1]))
    elif role == "consume":
        coro = consume(int(args[0]), int(args[1]), float(args[2]))
    elif role == "publish":
        coro = publish(float(args[0]), float(args[1]))
    elif role == "enqueue":
        coro = enqueue(int(args[0]), args[1])
    else:
        raise SystemExit(f"unknown role {role!r}")
    asyncio.run(coro)


if __name__ == "__main__":
    main(sys.argv[1:])
