"""Bounded memory: one worker process drains a backlog of 1,000,000 messages; its peak RSS
must stay under 200 MB.

The backlog is published first; then a child process runs a broker with one subscriber
(default settings, a no-op handler) until every message is archived, while this process
samples the child's resident set size with psutil.

    python -m bench.rss_backlog --db postgresql --messages 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import time
import uuid

import psutil

from sqlmq import Broker, Message

from .common import ROOT, url_for

QUEUE = "backlog"


async def drain(url: str, prefix: str, messages: int) -> dict[str, int]:
    """The child: consume until ``messages`` are archived."""
    broker = Broker(url, table_prefix=prefix)

    @broker.subscriber(QUEUE)
    async def handle(msg: Message) -> None:
        pass

    await broker.start()
    (runtime,) = broker.runtimes
    while runtime.counters.completed < messages:
        await asyncio.sleep(0.2)
    counters = dict(vars(runtime.counters))
    await broker.close()
    return counters


async def publish(url: str, prefix: str, messages: int, chunk: int = 10_000) -> None:
    async with Broker(url, table_prefix=prefix) as broker:
        await broker.migrate()
        for start in range(0, messages, chunk):
            n = min(chunk, messages - start)
            await broker.publish_batch(QUEUE, ({"n": start + i} for i in range(n)))


async def drop(url: str, prefix: str) -> None:
    async with Broker(url, table_prefix=prefix) as broker, broker.db.begin() as conn:
        await conn.run_sync(lambda c: broker.schema.metadata.drop_all(c))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql",
                        choices=["postgresql", "mariadb", "sqlite"])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--limit-mb", type=float, default=200.0)
    parser.add_argument("--child", nargs=2, metavar=("URL", "PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        counters = asyncio.run(drain(args.child[0], args.child[1], args.messages))
        print(json.dumps(counters), flush=True)
        return

    url = url_for(args.db)
    prefix = f"rss{uuid.uuid4().hex[:8]}_"
    t0 = time.monotonic()
    asyncio.run(publish(url, prefix, args.messages))
    publish_s = time.monotonic() - t0
    print(f"published {args.messages} in {publish_s:.0f}s", file=sys.stderr, flush=True)
    try:
        t0 = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.rss_backlog", "--messages", str(args.messages),
             "--child", url, prefix],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )
        proc = psutil.Process(child.pid)
        peak, samples = 0, []
        while child.poll() is None:
            try:
                rss = proc.memory_info().rss
            except psutil.NoSuchProcess:
                break
            peak = max(peak, rss)
            samples.append((round(time.monotonic() - t0, 1), round(rss / 2**20, 1)))
            time.sleep(0.05)
        out, _ = child.communicate()
        drain_s = time.monotonic() - t0
    finally:
        asyncio.run(drop(url, prefix))
    if child.returncode != 0:
        sys.exit(f"the draining worker failed (exit {child.returncode})")
    peak_mb = peak / 2**20
    every = max(1, len(samples) // 10)
    result = {
        "database": args.db, "messages": args.messages, "publish_s": round(publish_s, 1),
        "drain_s": round(drain_s, 1), "rate_per_s": round(args.messages / drain_s),
        "peak_rss_mb": round(peak_mb, 1), "limit_mb": args.limit_mb,
        "under_limit": peak_mb < args.limit_mb,
        "rss_mb_over_time": samples[::every],
        "worker_counters": json.loads(out.strip().splitlines()[-1]),
        "command": "python -m bench.rss_backlog " + shlex.join(sys.argv[1:]),
    }
    print(json.dumps(result))
    if not result["under_limit"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
