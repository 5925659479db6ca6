"""Request/reply round trip: ``broker.request`` (publish, then wait for the result) from this
process to a subscriber with ``results=True`` in another process, at a steady rate, on each
database. In the same rounds, alternating with it, the bare publish -> handler start across
two processes of :mod:`bench.latency`: the least a request can cost is a publish and a
pickup, before its result comes back.

A round trip is timed from the ``request`` call to its return, in this process; requests
overlap when one takes longer than the interval (up to ``OVERLAP`` at once, as independent
callers would: at 500/s a round trip of 100 ms keeps 50 in flight). The handler returns
its 64-byte body; the subscriber has ``@broker.subscriber``'s defaults (an awaited result
is written at once, not after ``flush_interval``).

    .venv/bin/python -m bench.request_reply [--db all] [--rates 50,500] [--seconds 10]
                                            [--repeat 3]

Role (started by the run):  python -m bench.request_reply serve URL PREFIX
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from typing import Any

from sqlmq import Broker

from .common import DATABASES, PREFIX, QUEUE, drop_tables, median, spawn, table, url_for
from .latency import WARMUP, latency_sqlmq, read_json
from .pacing import paced

#: The most requests in flight at once (bench.latency's publishes overlap up to 32: a
#: request is in flight for its whole round trip, so 32 would cap the rate itself).
OVERLAP = 512


async def serve(url: str, prefix: str) -> None:
    """The answering process: one subscriber that keeps its results, until SIGTERM."""
    broker = Broker(url, table_prefix=prefix)

    @broker.subscriber(QUEUE, results=True)
    async def answer(body: bytes) -> bytes:
        return body

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await broker.start()
    if broker.listener is not None:
        await asyncio.wait_for(broker.listener.connected.wait(), 30)
    print(json.dumps({"ready": True}), flush=True)
    await stop.wait()
    await broker.close()


async def round_trips(db: str, rate: float, seconds: float) -> dict[str, float]:
    """Requests at ``rate`` for ``seconds`` to a subscriber in another process: the round
    trips' percentiles (ms) and the rate achieved."""
    url = url_for(db)
    drop_tables(url)
    broker = Broker(url, table_prefix=PREFIX)
    await broker.migrate()
    server = spawn(["bench.request_reply", "serve", url, PREFIX])
    try:
        await asyncio.to_thread(read_json, server, "ready", 120)
        for _ in range(20):  # connections, prepared statements, the result listener
            await broker.request(QUEUE, b"warm", timeout=60)
        trips: list[float] = []

        async def one(payload: bytes) -> None:
            start = time.perf_counter()
            assert await broker.request(QUEUE, payload, timeout=60) == payload
            trips.append(time.perf_counter() - start)

        achieved = await paced(rate, seconds, one, overlap=OVERLAP)
        return {**_percentiles(trips), "rate": achieved, "reads": float(broker._results.reads)}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(server.wait, 30)
        except subprocess.TimeoutExpired:
            server.kill()
        await broker.close()
        drop_tables(url)


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds[int(len(seconds) * WARMUP):])

    def pct(p: float) -> float:
        return 1000 * ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return {"p50": pct(50), "p95": pct(95), "p99": pct(99), "n": float(len(seconds))}


def run(dbs: list[str], rates: list[float], seconds: float, repeat: int) -> str:
    got: dict[tuple[str, float, str], list[dict[str, float]]] = {}
    for r in range(repeat):
        for db in dbs:
            for rate in rates:
                cases = [("request", round_trips), ("pickup", latency_sqlmq)]
                for name, case in cases if r % 2 == 0 else cases[::-1]:
                    figures = asyncio.run(case(db, rate, seconds))
                    got.setdefault((db, rate, name), []).append(figures)
                    print(f"round {r + 1}: {db} {rate:g}/s {name}: p50 {figures['p50']:.2f} "
                          f"p99 {figures['p99']:.2f} ms", file=sys.stderr, flush=True)
    rows: list[list[Any]] = []
    for db in dbs:
        for rate in rates:
            req, pick = got[db, rate, "request"], got[db, rate, "pickup"]

            def med(runs: list[dict[str, float]], key: str) -> float:
                return median([f[key] for f in runs])

            rows.append([db, f"{rate:g}/s", med(req, "p50"), med(req, "p95"), med(req, "p99"),
                         med(req, "rate"), median([f["reads"] / f["n"] for f in req]),
                         med(pick, "p50"), med(pick, "p99")])
    return table(f"request/reply round trip across processes (ms, medians of {repeat} "
                 f"rounds of {seconds:g} s), beside publish -> handler start",
                 ["database", "rate", "request p50", "p95", "p99", "achieved/s",
                  "reads/request", "pickup p50", "pickup p99"], rows)


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        asyncio.run(serve(argv[1], argv[2]))
        return
    p = argparse.ArgumentParser(prog="python -m bench.request_reply", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="all", choices=[*DATABASES, "all"])
    p.add_argument("--rates", default="50,500", help="requests per second")
    p.add_argument("--seconds", type=float, default=10.0, help="requesting time per case")
    p.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    args = p.parse_args(argv)
    dbs = list(DATABASES) if args.db == "all" else [args.db]
    rates = [float(r) for r in args.rates.split(",")]
    print(run(dbs, rates, args.seconds, args.repeat))
    print(f"\nreproduce: .venv/bin/python -m bench.request_reply --db {args.db} "
          f"--rates {args.rates} --seconds {args.seconds:g} --repeat {args.repeat}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in _load())}")


def _load() -> tuple[float, ...]:
    import os

    return os.getloadavg()


if __name__ == "__main__":
    main(sys.argv[1:])
