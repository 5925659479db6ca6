"""Processes curve: one preloaded queue drained by 1, 2, 4 … worker processes.

Each process runs a broker with one subscriber on the defaults (``@broker.subscriber(QUEUE)``,
no-op handler), as a service scaled out to several hosts or containers would. The processes
start, open their connections and wait; the clock starts when all are told to go and stops
when no message is left unsettled (polled every 10 ms, one primary-key descent on a
connection of the orchestrator's own). Meanwhile, until the backlog is done, the
orchestrator publishes one message at a time to the same queue every 5 ms, as another
service would, and times each publish: on SQLite, a writer from a process of its own
beside busy workers.

Role (one JSON line per step; the orchestrator writes ``go`` then ``stop`` on stdin):
  python -m bench.processes work DB_URL PREFIX
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import NamedTuple

from sqlalchemy import func, select

from sqlmq import Broker

from .common import PAYLOAD, PREFIX, QUEUE, ROOT, drop_tables, fresh_broker, url_for
from .drain import archived, preload
from .latency import emit, read_json

POLL = 0.01
#: How often the orchestrator publishes a single message during the drain.
PROBE_EVERY = 0.005
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def process_ticks(pid: int) -> int:
    """User plus system CPU ticks of one process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


async def work(url: str, prefix: str) -> None:
    broker = Broker(url, table_prefix=prefix)

    @broker.subscriber(QUEUE)
    async def handle(body: bytes) -> None:
        pass

    await broker.stats()  # the pool's first connection, before go (and no row left behind)
    loop = asyncio.get_running_loop()
    emit(ready=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # go
    await broker.start()
    await loop.run_in_executor(None, sys.stdin.readline)  # stop
    # The orchestrator saw the table empty once the last flush committed; its counts are
    # added when the flush returns, which the stop waits for.
    runtimes = broker.runtimes
    await broker.stop()
    completed = sum(r.counters.completed for r in runtimes)
    await broker.close()
    emit(completed=completed)


async def lowest(broker: Broker) -> int | None:
    """The lowest id left unsettled, if any: one primary-key descent. A count of the archive
    instead cost the database a few ms per poll, every 10 ms, in the middle of the CPU the
    curve reports."""
    m = broker.schema.message
    async with broker.db.connect() as conn:
        return (await conn.execute(select(m.c.id).order_by(m.c.id).limit(1))).scalar()


async def highest(broker: Broker) -> int:
    m = broker.schema.message
    async with broker.db.connect() as conn:
        return int((await conn.execute(select(func.max(m.c.id)))).scalar_one())


async def probe(broker: Broker, stop: asyncio.Event, took: list[float]) -> None:
    """A single publish to the drained queue every :data:`PROBE_EVERY` seconds, as another
    service's process would (the orchestrator is a process of its own), each one's time
    in ``took``: how long a publisher waits beside busy workers."""
    while not stop.is_set():
        start = time.perf_counter()
        await broker.publish(QUEUE, PAYLOAD)
        took.append(time.perf_counter() - start)
        await asyncio.sleep(PROBE_EVERY)


def _spawn(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.processes", "work", url, PREFIX],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def _say(procs: list[subprocess.Popen[str]], word: str) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(word + "\n")
        p.stdin.flush()


class Drained(NamedTuple):
    rate: float  # messages per second, the probes' included
    shares: list[int]  # how many each process completed
    cpu: dict[str, float]  # in cores: the whole machine, the worker processes, the rest
    publishes: list[float]  # the probes' single publishes, seconds each


async def drain_processes(db: str, n: int, processes: int, timeout: float = 600) -> Drained:
    """``processes`` worker processes drain ``n`` messages, and the single publishes of
    :func:`probe` until the ``n`` are done (the rest is the database and this
    orchestrator)."""
    broker = await fresh_broker(db)
    url = url_for(db)
    procs: list[subprocess.Popen[str]] = []
    probing: asyncio.Task[None] | None = None
    try:
        await preload(broker, n)
        last = await highest(broker)
        procs = [_spawn(url) for _ in range(processes)]
        for p in procs:
            await asyncio.to_thread(read_json, p, "ready", 60)
        busy0, total0 = machine_ticks()
        workers0 = sum(process_ticks(p.pid) for p in procs)
        stop, took = asyncio.Event(), []
        start = time.perf_counter()
        _say(procs, "go")
        probing = asyncio.create_task(probe(broker, stop, took))
        # Done when nothing is left once the probes have stopped (they stop with the backlog).
        while (low := await lowest(broker)) is not None or not stop.is_set():
            if (low is None or low > last) and not stop.is_set():
                stop.set()
                await probing
            if time.perf_counter() - start > timeout:
                raise RuntimeError(f"{processes} processes left messages after "
                                   f"{timeout:.0f} s")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker process ended before the drain did")
            await asyncio.sleep(POLL)
        elapsed = time.perf_counter() - start
        n += len(took)
        busy1, total1 = machine_ticks()
        workers = (sum(process_ticks(p.pid) for p in procs) - workers0) / TICK / elapsed
        cores = os.cpu_count() or 1
        machine = cores * (busy1 - busy0) / max(1, total1 - total0)
        cpu = {"machine": machine, "workers": workers, "rest": machine - workers}
        _say(procs, "stop")
        shares = [(await asyncio.to_thread(read_json, p, "completed", 60))["completed"]
                  for p in procs]
        for p in procs:
            p.wait(30)
        if sum(shares) != n or await archived(broker) != n:
            raise RuntimeError(f"processes completed {sum(shares)} of {n} messages ({shares})")
        return Drained(n / elapsed, shares, cpu, took)
    finally:
        if probing is not None:
            probing.cancel()
        for p in procs:
            p.kill()
        await broker.close()
        drop_tables(url)


def main(argv: list[str]) -> None:
    role, url, prefix = argv
    if role != "work":
        raise SystemExit(f"unknown role {role!r}")
    asyncio.run(work(url, prefix))


if __name__ == "__main__":
    main(sys.argv[1:])
