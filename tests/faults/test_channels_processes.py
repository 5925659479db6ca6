"""Channels under three OS processes on each database: the limits hold across processes.

The handlers write each execution's start and end in the database, on its clock
(:func:`~tests.faults.harness.runs_table`); the checks read the running count off those
rows. A SIGKILLed handler has no end: its slot is held until recovery moves its message back,
which its history records (``lease_expired``, with the database's time), so that is its end.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Table, func, literal, select

from sqlmq import Broker, Retry
from sqlmq.sqltime import db_now_plus

from .harness import (
    Tables,
    WorkerPool,
    WorkerSpec,
    history,
    outcome,
    runs_table,
    wait_for,
    wait_ready,
)

#: Seconds. On SQLite the three processes' writes (acquires, settles, the handlers' run rows,
#: renewals) queue for the one write lock; on a loaded machine (the suite's five processes
#: on two cores) a renewal waited 1.7-2.0 s for it, so a 2 s lease was lost before its
#: renewal landed, ~400 times a process, and the runs that came back raced for the lock
#: too: 83 archived in 120 s. A lease must outlast the longest a write can wait.
LEASE = 5.0
RECOVERY_INTERVAL = 0.5


@pytest.fixture
def runs(tables: Tables, prefix: str) -> Iterator[Table]:
    table = runs_table(prefix)
    table.create(tables.db)
    try:
        yield table
    finally:
        table.drop(tables.db)


def _configure(url: str, prefix: str, **channels: dict[str, Any]) -> None:
    async def go() -> None:
        async with Broker(url, table_prefix=prefix) as broker:
            for name, settings in channels.items():
                if name.startswith("default:"):
                    await broker.set_channel_default(name.split(":", 1)[1], **settings)
                else:
                    await broker.set_channel(name, **settings)

    asyncio.run(go())


def _db_now(tables: Tables) -> datetime:
    """The database's clock, as the runs and history entries are written (aware UTC)."""
    with tables.db.connect() as conn:
        return conn.execute(select(db_now_plus(literal(0.0)))).scalar_one()


def _run_rows(tables: Tables, runs: Table) -> list[Any]:
    with tables.db.connect() as conn:
        return list(conn.execute(select(runs).order_by(runs.c.id)))


def _archive(tables: Tables) -> dict[int, Any]:
    return {r.id: r for r in tables.archive_rows()}


def _intervals(run_rows: list[Any], archive: dict[int, Any]
               ) -> tuple[dict[str, list[tuple[datetime, datetime]]], list[tuple[int, datetime]]]:
    """Each channel's executions as (start, end); one cut short ends when recovery took its
    message back. Also the process and recovery time of each cut short: killed, or
    cancelled by its own process when its lease could not be renewed in time (a loaded
    SQLite can starve a writer of the lock for longer than a 2 s lease)."""
    out: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    recovered: list[tuple[int, datetime]] = []
    for r in run_rows:
        end = r.ended_at
        if end is None:
            expiries = [e for e in history(archive[r.msg_id])
                        if e.get("delivery") == r.delivery and e.get("ended") == "lease_expired"]
            assert expiries, f"execution {r.msg_id}/{r.delivery} neither ended nor recovered"
            end = datetime.fromisoformat(expiries[0]["at"])
            recovered.append((r.pid, end))
        out[r.channel].append((r.started_at, end))
    return out, recovered


def _busiest(tables: Tables, runs: Table) -> int:
    with tables.db.connect() as conn:
        return conn.execute(select(runs.c.pid).where(runs.c.ended_at.is_(None))
                            .group_by(runs.c.pid).order_by(func.count().desc())
                            .limit(1)).scalar_one()


def _peak(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most executions running at once; at equal times an end comes before a start
    (the database clock's resolution is a millisecond on SQLite)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.slow
def test_twenty_channels_of_two_hold_across_three_processes_and_a_sigkill(
    tables: Tables, runs: Table, db_url: str, prefix: str, log_dir: Path
) -> None:
    channels = [f"t{i}" for i in range(20)]
    _configure(db_url, prefix, **{c: {"max_concurrency": 2} for c in channels})
    published: list[int] = []
    for c in channels:
        published += tables.publish("jobs", ({"c": c, "n": n} for n in range(30)), channel=c)
    spec = WorkerSpec(
        url=db_url, prefix=prefix, queue="jobs", log_dir=str(log_dir), handler="channel_runs",
        sleep=0.1, recovery_interval=RECOVERY_INTERVAL,
        subscriber={"workers": 16, "fetch_batch": 16, "prefetch": 16, "lease": LEASE,
                    "flush_interval": 0.02, "max_fetch_interval": 0.1},
    )
    pool = WorkerPool(spec)
    try:
        pool.start(3)
        wait_ready(log_dir, 3, watch=[pool])
        wait_for(lambda: tables.archived() >= 200, 120, "not 200 archived after 120 s",
                 [pool])
        killed_at = _db_now(tables)
        # the process running the most handlers dies (one that buffered less may run
        # none: the others' deliveries can hold every slot); a replacement starts
        pool.kill(killed := _busiest(tables, runs))
        wait_for(lambda: tables.left() == 0, 180, "the queue not drained after 180 s",
                 [pool])
    finally:
        pool.stop()

    o = outcome(tables, published, log_dir)
    assert (o.archived, o.left, o.lost, o.double_archived) == (len(published), 0, 0, 0)
    assert o.completed == len(published) and o.delivery_executed_twice == 0
    per_channel, recovered = _intervals(_run_rows(tables, runs), _archive(tables))
    peaks = {c: _peak(iv) for c, iv in per_channel.items()}
    assert max(peaks.values()) == 2, peaks  # the limit was reached, and never passed
    cut = sorted(at for pid, at in recovered if pid == killed)
    assert cut, "the SIGKILL cut no handler short"
    # Each slot the killed process held came free within a lease and a recovery round.
    late = killed_at + timedelta(seconds=LEASE + RECOVERY_INTERVAL + 2.5)
    assert all(at <= late for at in cut), (killed_at, cut)


@pytest.mark.slow
@pytest.mark.timing
def test_a_channel_at_twenty_a_second_starts_two_hundred_in_ten_seconds_across_processes(
    tables: Tables, runs: Table, db_url: str, prefix: str, log_dir: Path
) -> None:
    _configure(db_url, prefix, api={"rate": 20.0})
    tables.publish("jobs", ({"c": "api", "n": n} for n in range(400)), channel="api")
    spec = WorkerSpec(url=db_url, prefix=prefix, queue="jobs", log_dir=str(log_dir),
                      handler="channel_runs", subscriber={"lease": 30.0})
    pool = WorkerPool(spec)
    try:
        pool.start(3)
        wait_ready(log_dir, 3, watch=[pool])
        wait_for(lambda: bool(_run_rows(tables, runs)), 60, "no start after 60 s", [pool])
        first = _run_rows(tables, runs)[0].started_at
        wait_for(lambda: _db_now(tables) > first + timedelta(seconds=10.5), 60,
                 "the database clock did not pass 10.5 s in 60 s", [pool])
    finally:
        pool.stop()
    starts = [r.started_at for r in _run_rows(tables, runs)]
    in_ten = [s for s in starts if first <= s < first + timedelta(seconds=10)]
    print(f"\nrate 20/s across 3 processes: {len(in_ten)} starts in 10 s")
    assert 180 <= len(in_ten) <= 220, len(in_ten)
    assert len({r.pid for r in _run_rows(tables, runs)}) > 1  # the processes shared it


@pytest.mark.slow
def test_forty_ordered_channels_run_in_publish_order_across_processes_with_failures(
    tables: Tables, runs: Table, db_url: str, prefix: str, log_dir: Path
) -> None:
    _configure(db_url, prefix, **{"default:jobs": {"ordered": True}})
    published: dict[str, list[int]] = {}
    # 12 messages a channel: a chain runs one message at a time, so its length sets the
    # test's time, and the channels' count the work of every round (a hundred chains of
    # 20 took 35-76 s); 480 messages still see about 50 failures retried.
    for i in range(40):
        c = f"o{i}"
        published[c] = tables.publish("jobs", ({"c": c, "n": n} for n in range(12)), channel=c)
    spec = WorkerSpec(
        url=db_url, prefix=prefix, queue="jobs", log_dir=str(log_dir), handler="channel_runs",
        fail=0.1, subscriber={"lease": 30.0, "retry": Retry.constant(0.05, max_attempts=50)},
    )
    pool = WorkerPool(spec)
    try:
        pool.start(3)
        wait_ready(log_dir, 3, watch=[pool])
        wait_for(lambda: tables.left() == 0, 300, "the queue not drained after 300 s",
                 [pool])
    finally:
        pool.stop()

    archive = _archive(tables)
    every = list(itertools.chain.from_iterable(published.values()))
    assert sorted(archive) == sorted(every)
    assert {r.state for r in archive.values()} == {"COMPLETED"}
    run_rows = _run_rows(tables, runs)
    assert any(r.delivery > 1 for r in run_rows)  # failures were retried
    per_channel, recovered = _intervals(run_rows, archive)
    assert not recovered
    assert {c: _peak(iv) for c, iv in per_channel.items()} == {c: 1 for c in published}
    for c, ids in published.items():
        mine = [r for r in run_rows if r.channel == c]  # by row id: the order they started
        order = [k for k, _ in itertools.groupby(r.msg_id for r in mine)]
        assert order == ids, c  # in publish order, a retry before anything after it
        first_start = {}
        for r in mine:
            first_start.setdefault(r.msg_id, r.started_at)
        for before, after in itertools.pairwise(ids):  # each after the one before ended
            assert first_start[after] >= archive[before].archived_at, (c, before)
