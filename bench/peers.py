"""Drain beside the PostgreSQL job queues: sqlmq, PGQueuer, graphile-worker and pg-boss
each drain the same pre-published no-op jobs, with what it costs the database.

Every contender gets a database of its own, made for the round and dropped after, so that
each starts from empty tables and its costs can be told apart on a shared server (see
:mod:`bench.db_costs`). Rounds alternate between the contenders, so all see the same
machine. For each drain: msg/s (the clock runs from the worker's start to the last job
completed in the database), the publish of the jobs before it (msg/s, chunks of 5,000),
WAL bytes per message, the CPU of the database's server processes per 1,000 messages and
the rows inserted, updated and deleted per message.

The contenders, each on its documented fast settings at a concurrency of 16:

* ``sqlmq``: one subscriber with the drain's options (:data:`bench.drain.SQLMQ_DRAIN`) and
  16 workers, archiving every message; ``sqlmq-delete``: the same with ``archive="none"``
  (completed messages deleted, as graphile-worker does).
* ``pgqueuer``: one QueueManager in drain mode, ``batch_size`` 100
  (bench/peer_pgqueuer.py, bench/.venv-pgqueuer).
* ``graphile-fast``: graphile-worker with a local queue of 500 and job completions batched
  (the configuration of its performance page); ``graphile-default``: neither.
* ``pg-boss``: 16 ``work()`` loops of ``batchSize`` 100 polling every 0.5 s (its minimum);
  completed jobs stay in its table, marked completed, until its maintenance archives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlmq import Broker

from .common import PEER_PREFIX, PEER_PYTHON, PEER_SCRIPT, PREFIX, QUEUE, median, table
from .db_costs import (
    DatabaseCpu,
    OwnWal,
    fresh_database,
    own_wal,
    pause_for_stats,
    row_writes,
    wal_bytes,
    wal_kept,
    wal_lsn,
)
from .drain import SQLMQ_DRAIN, preload
from .peer_node import node_role, node_worker

CONCURRENCY = 16
PGQUEUER_BATCH = 100
CONTENDERS = ("sqlmq", "sqlmq-delete", "pgqueuer", "graphile-fast", "graphile-default",
              "pg-boss")
LABELS = {
    "sqlmq": "sqlmq (archive all)",
    "sqlmq-delete": 'sqlmq (archive="none")',
    "pgqueuer": f"PGQueuer (batch_size={PGQUEUER_BATCH})",
    "graphile-fast": "graphile-worker (local queue, batched completion)",
    "graphile-default": "graphile-worker (defaults)",
    "pg-boss": "pg-boss (batchSize 100, 16 loops)",
}


@dataclass
class Drained:
    seconds: float
    publish_seconds: float
    wal: int
    cpu: float
    writes: dict[str, int]
    own: OwnWal | None


#: A drain: given the database's URL and n, yields its seconds while its connections are
#: still open, and cleans up on leaving.
Drain = Callable[[str, int], contextlib.AbstractContextManager[float]]


# ---- sqlmq -----------------------------------------------------------------------------------

def _sqlmq_preload(url: str, n: int) -> float:
    async def run() -> float:
        broker = Broker(url, table_prefix=PREFIX)
        try:
            await broker.migrate()
            return await preload(broker, n)
        finally:
            await broker.close()

    return asyncio.run(run())


@contextlib.contextmanager
def _sqlmq_drain(url: str, n: int, archive: str) -> Iterator[float]:
    with asyncio.Runner() as runner:
        broker = Broker(url, table_prefix=PREFIX)

        @broker.subscriber(QUEUE, **{**SQLMQ_DRAIN, "workers": CONCURRENCY}, archive=archive)
        async def handle(body: bytes) -> None:
            pass

        async def until_done() -> float:
            start = time.perf_counter()
            await broker.start()
            while sum(r.counters.completed for r in broker.runtimes) < n:
                await asyncio.sleep(0.002)
            return time.perf_counter() - start

        try:
            yield runner.run(until_done())
        finally:
            runner.run(broker.stop())
            runner.run(broker.close())


def sqlmq_drain(archive: str) -> Drain:
    return lambda url, n: _sqlmq_drain(url, n, archive)


# ---- PGQueuer --------------------------------------------------------------------------------

def _pgqueuer(dsn: str, *args: object) -> dict[str, Any]:
    if not PEER_PYTHON.exists():
        raise SystemExit("PGQueuer is not installed for the benchmark: run bench/setup.sh")
    out = subprocess.run([str(PEER_PYTHON), str(PEER_SCRIPT), *map(str, args)],
                         env={**os.environ, "PGQUEUER_PREFIX": PEER_PREFIX, "BENCH_PG_DSN": dsn},
                         capture_output=True, text=True, timeout=1800, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"pgqueuer {args[0]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pgqueuer_preload(url: str, n: int) -> float:
    _pgqueuer(url, "install")
    return float(_pgqueuer(url, "preload", n)["seconds"])


@contextlib.contextmanager
def _pgqueuer_drain(url: str, n: int) -> Iterator[float]:
    """PGQueuer's worker ends by itself once the queue is empty (its connection's last
    moments, after the drain, can fall outside the CPU read)."""
    got = _pgqueuer(url, "work", n, PGQUEUER_BATCH)
    if got["handled"] != n:
        raise RuntimeError(f"PGQueuer handled {got['handled']} of {n}")
    yield float(got["seconds"])


# ---- graphile-worker and pg-boss -------------------------------------------------------------

def _node_preload(peer: str) -> Callable[[str, int], float]:
    return lambda url, n: float(node_role(peer, url, "preload", n)["seconds"])


@contextlib.contextmanager
def _node_drain(peer: str, url: str, n: int, *args: object) -> Iterator[float]:
    with node_worker(peer, url, n, *args) as got:
        if got["handled"] < n:
            raise RuntimeError(f"{peer} handled {got['handled']} of {n}")
        yield float(got["seconds"])


def node_drain(peer: str, *args: object) -> Drain:
    return lambda url, n: _node_drain(peer, url, n, *args)


#: contender -> (publish n jobs into a fresh database: seconds, drain them).
SYSTEMS: dict[str, tuple[Callable[[str, int], float], Drain]] = {
    "sqlmq": (_sqlmq_preload, sqlmq_drain("all")),
    "sqlmq-delete": (_sqlmq_preload, sqlmq_drain("none")),
    "pgqueuer": (_pgqueuer_preload, _pgqueuer_drain),
    "graphile-fast": (_node_preload("graphile-worker"), node_drain("graphile-worker", "fast")),
    "graphile-default": (_node_preload("graphile-worker"),
                         node_drain("graphile-worker", "default")),
    "pg-boss": (_node_preload("pg-boss"), node_drain("pg-boss")),
}


def measured(name: str, n: int, waldump: bool = False) -> Drained:
    """One drain of ``n`` jobs by contender ``name`` in a database made for it."""
    publish, drain = SYSTEMS[name]
    database = f"benchpeers{os.getpid()}_{name.replace('-', '_')}"
    with fresh_database(database) as url:
        publish_seconds = publish(url, n)
        pause_for_stats()
        before = row_writes(database)
        kept = wal_kept(f"benchpeers{os.getpid()}") if waldump else contextlib.nullcontext()
        with kept:
            cpu = DatabaseCpu(database)
            start = wal_lsn()
            cpu.start()
            with drain(url, n) as seconds:
                cpu_seconds = cpu.stop()
                end = wal_lsn()
            own = own_wal(start, end, database) if waldump else None
        pause_for_stats()
        after = row_writes(database)
    return Drained(seconds, publish_seconds, wal_bytes(start, end), cpu_seconds,
                   {k: after[k] - before[k] for k in after}, own)


def run_peers(n: int, repeat: int, contenders: list[str], waldump: bool,
              log: Callable[[str], None]) -> str:
    got: dict[str, list[Drained]] = {c: [] for c in contenders}
    for r in range(repeat):
        for name in contenders:  # alternating, so every contender sees the same machine
            d = measured(name, n, waldump)
            got[name].append(d)
            log(f"round {r + 1}: {name} {n / d.seconds:,.0f} msg/s, publish "
                f"{n / d.publish_seconds:,.0f} msg/s, WAL {d.wal / n:,.0f} B/msg"
                + (f" (own {d.own.bytes / n:,.0f})" if d.own else "")
                + f", db CPU {1000 * d.cpu / n * 1000:.1f} ms/1000, writes "
                + "/".join(f"{d.writes[k] / n:.2f}" for k in ("ins", "upd", "del")))
    rows = []
    for name in contenders:
        runs = got[name]
        rates = [n / d.seconds for d in runs]
        row: list[Any] = [
            LABELS[name], median(rates), f"{min(rates):,.0f}-{max(rates):,.0f}",
            median([n / d.publish_seconds for d in runs]),
            median([d.wal / n for d in runs]),
        ]
        if waldump:
            row.append(median([d.own.bytes / n for d in runs if d.own]))
            row.append(median([(d.own.bytes - d.own.fpw_bytes) / n for d in runs if d.own]))
        row.append(median([1e6 * d.cpu / n for d in runs]))
        row.append(" / ".join(f"{median([d.writes[k] / n for d in runs]):.2f}"
                              for k in ("ins", "upd", "del")))
        rows.append(row)
    header = ["contender", "msg/s", "min-max", "publish msg/s", "WAL B/msg (cluster)"]
    if waldump:
        header += ["WAL B/msg (own)", "own, no FPI"]
    header += ["DB CPU ms/1000 msg", "rows ins / upd / del per msg"]
    text = table(
        f"drain beside the PostgreSQL job queues: {n:,} pre-published no-op jobs, concurrency "
        f"{CONCURRENCY}, a fresh database per contender per round, {repeat} rounds "
        f"alternating (medians)", header, rows)
    text += ("\nWAL (cluster): pg_current_wal_lsn() before and after the drain, everyone's "
             "records on the server; (own): the records of the contender's database and its "
             "transactions, by pg_waldump; no FPI: without the records that carry a full-page "
             "image (a checkpoint during the drain adds them). DB CPU: that database's "
             "backends and autovacuum workers, from /proc. Rows: pg_stat_user_tables over the "
             "drain.")
    if waldump:
        for name in contenders:
            text += "\n\n" + wal_breakdown(name, got[name][-1], n)
    return text


def wal_breakdown(name: str, d: Drained, n: int, top: int = 8) -> str:
    """The last round's own WAL of ``name`` by record type and by relation (bytes/msg)."""
    assert d.own is not None
    kinds = [[k, d.own.count_by_type[k] / n, b / n]
             for k, b in d.own.by_type.most_common(top)]
    rels = [[k, b / n] for k, b in d.own.by_relation.most_common(top)]
    return (table(f"{LABELS[name]}: WAL by record type (last round; {d.own.bytes / n:,.0f} "
                  f"B/msg, full-page images {d.own.fpw_bytes / n:,.0f})",
                  ["rmgr/record", "records/msg", "B/msg"], kinds)
            + "\n" + table(f"{LABELS[name]}: WAL by relation", ["relation", "B/msg"], rels))
