"""Latency: publish -> handler start, at a steady rate, publisher and subscriber in separate
processes (and, for sqlmq, also both in one process).

Each payload starts with the wall clock at its publish call (bench/pacing.py); the handler
subtracts it from its own clock at start. Same host, so one clock. PGQueuer runs the same
publisher and handler in its own venv.

Roles (run by the orchestrating functions below, one JSON line each):
  python -m bench.latency consume DB PREFIX EXPECTED TIMEOUT
  python -m bench.latency publish DB PREFIX RATE SECONDS
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from typing import Any

from sqlmq import Broker

from .common import (
    PREFIX,
    QUEUE,
    drop_tables,
    fresh_broker,
    fresh_peer_schema,
    peer,
    spawn,
    url_for,
)
from .pacing import latency_of, paced

WARMUP = 0.05  # the first 5 % of samples (connections, prepared statements) are left out
PEER_BATCH = 10


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def collect_latencies(broker: Broker, expected: int) -> tuple[list[float], asyncio.Event]:
    """Subscribe a handler that records each message's latency; the event fires at
    ``expected`` messages."""
    latencies: list[float] = []
    done = asyncio.Event()

    @broker.subscriber(QUEUE)
    async def handle(body: bytes) -> None:
        latencies.append(latency_of(body))
        if len(latencies) >= expected:
            done.set()

    return latencies, done


async def consume(db: str, prefix: str, expected: int, timeout: float) -> None:
    broker = Broker(url_for_role(db), table_prefix=prefix)
    latencies, done = collect_latencies(broker, expected)

    await broker.start()
    if broker.listener is not None:
        await asyncio.wait_for(broker.listener.connected.wait(), 30)
    emit(ready=True)
    try:
        await asyncio.wait_for(done.wait(), timeout)
    except TimeoutError:
        pass
    await broker.close()
    emit(latencies=latencies)


async def publish(db: str, prefix: str, rate: float, seconds: float) -> None:
    broker = Broker(url_for_role(db), table_prefix=prefix)
    # Open the pool's connections outside the measured stream, as the peer's pool does.
    await asyncio.gather(*(broker.publish(QUEUE + "-warmup", b"") for _ in range(8)))
    achieved = await paced(rate, seconds, lambda p: broker.publish(QUEUE, p))
    await broker.close()
    emit(rate=achieved)


def url_for_role(db: str) -> str:
    return db if "://" in db else url_for(db)


def read_json(proc: subprocess.Popen[str], key: str, timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if key in data:
            return data
    proc.kill()
    raise RuntimeError(f"a latency process ended without reporting {key!r}")


def _summary(latencies: list[float], rate: float) -> dict[str, float]:
    samples = latencies[int(len(latencies) * WARMUP):]
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return 1000 * ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return {"p50": pct(50), "p95": pct(95), "p99": pct(99), "n": float(len(latencies)),
            "rate": rate}


PER_PUBLISHER = 1000  # msg/s one publishing process is asked for; more rate, more processes


def publishers_for(rate: float) -> int:
    """One publishing process per 1,000 msg/s: a process publishing one transaction per
    message tops out near that here, and a busy service has many request handlers anyway.
    sqlmq and PGQueuer get the same number."""
    return max(1, math.ceil(rate / PER_PUBLISHER))


def _run_pair(consumer_args: list[str], publisher_args: list[str], expected: int,
              seconds: float, peer_side: bool, publishers: int = 1) -> dict[str, float]:
    """One subscriber process, ``publishers`` publisher processes; ``publisher_args`` is
    given the rate of one publisher."""
    consumer = spawn(consumer_args, peer_side=peer_side)
    procs = []
    try:
        read_json(consumer, "ready", 60)
        procs = [spawn(publisher_args, peer_side=peer_side) for _ in range(publishers)]
        achieved = sum(read_json(p, "rate", 4 * seconds + 120)["rate"] for p in procs)
        for p in procs:
            p.wait(30)
        got = read_json(consumer, "latencies", 4 * seconds + 180)
        consumer.wait(30)
    finally:
        for p in [consumer, *procs]:
            p.kill()
    latencies = got["latencies"]
    if len(latencies) < expected:
        raise RuntimeError(f"only {len(latencies)} of {expected} messages were handled")
    return _summary(latencies, achieved)


async def latency_sqlmq(db: str, rate: float, seconds: float) -> dict[str, float]:
    """Publisher and subscriber in two processes."""
    broker = await fresh_broker(db)
    await broker.close()
    n = publishers_for(rate)
    expected = int(rate / n * seconds) * n
    url = url_for(db)
    try:
        return await asyncio.to_thread(
            _run_pair,
            ["bench.latency", "consume", url, PREFIX, str(expected), str(4 * seconds + 120)],
            ["bench.latency", "publish", url, PREFIX, str(rate / n), str(seconds)],
            expected, seconds, False, n,
        )
    finally:
        drop_tables(url)


async def latency_sqlmq_in_process(db: str, rate: float, seconds: float) -> dict[str, float]:
    """Publisher and subscriber on one broker: the in-process wake-up, no NOTIFY needed."""
    broker = await fresh_broker(db)
    expected = int(rate * seconds)
    latencies, done = collect_latencies(broker, expected)

    try:
        await broker.start()
        await broker.publish(QUEUE + "-warmup", b"")
        achieved = await paced(rate, seconds, lambda p: broker.publish(QUEUE, p))
        await asyncio.wait_for(done.wait(), 120)
        return _summary(latencies, achieved)
    finally:
        await broker.close()
        drop_tables(url_for(db))


def latency_pgqueuer(rate: float, seconds: float, batch: int = PEER_BATCH) -> dict[str, float]:
    n = publishers_for(rate)
    expected = int(rate / n * seconds) * n
    fresh_peer_schema()
    try:
        return _run_pair(["consume", str(expected), str(batch), str(4 * seconds + 120)],
                         ["publish", str(rate / n), str(seconds)], expected, seconds, True, n)
    finally:
        peer("uninstall")


def main(argv: list[str]) -> None:
    role, db, prefix, *rest = argv
    if role == "consume":
        asyncio.run(consume(db, prefix, int(rest[0]), float(rest[1])))
    elif role == "publish":
        asyncio.run(publish(db, prefix, float(rest[0]), float(rest[1])))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
