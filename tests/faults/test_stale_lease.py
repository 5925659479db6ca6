"""Stale lease: handlers outlive their lease (no renewal) while another process recovers the
messages and completes them. The late results of the slow process must not land: each is
refused by the fence and counted stale, and the archive shows only the other's outcome."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .harness import (
    Tables,
    WorkerPool,
    WorkerSpec,
    counters,
    executions,
    history,
    wait_for,
    wait_ready,
)

MESSAGES = 20


@pytest.mark.slow
def test_results_of_expired_deliveries_never_land_and_are_counted_stale(
    tables: Tables, db_url: str, prefix: str, log_dir: Path
) -> None:
    published = tables.publish("jobs", ({"n": i} for i in range(MESSAGES)))
    slow_dir, fast_dir = log_dir / "slow", log_dir / "fast"
    slow_dir.mkdir()
    fast_dir.mkdir()
    # The slow process holds every message for 4s on a 1s lease it never renews, then
    # rejects: had any of those writes landed, the archive would show FAILED "stale write".
    slow = WorkerPool(WorkerSpec(
        url=db_url, prefix=prefix, queue="jobs", log_dir=str(slow_dir), handler="late_reject",
        sleep=4.0, recovery_interval=3600,
        subscriber={"workers": MESSAGES, "fetch_batch": MESSAGES, "lease": 1.0,
                    "renew_leases": False, "max_fetch_interval": 0.5},
    ))
    fast = WorkerPool(WorkerSpec(
        url=db_url, prefix=prefix, queue="jobs", log_dir=str(fast_dir), recovery_interval=0.2,
        subscriber={"lease": 30.0, "flush_interval": 0.02, "max_fetch_interval": 0.1},
    ))
    deadline = time.monotonic() + 120
    try:
        slow.start()
        wait_for(lambda: tables.processing() >= MESSAGES, deadline - time.monotonic(),
                 "the slow process did not take the messages", [slow], poll=0.02)
        fast.start()
        wait_ready(fast_dir, 1, watch=[slow, fast])
        wait_for(lambda: tables.left() == 0, deadline - time.monotonic(),
                 lambda: f"{tables.left()} messages left after 120s", [slow, fast])
        # Every slow handler finishes and tries its write before the processes stop.
        wait_for(lambda: len(executions(slow_dir)) >= MESSAGES, deadline - time.monotonic(),
                 "the slow handlers did not finish", [slow])
    finally:
        fast.stop()
        slow.stop()

    rows = tables.archive_rows()
    assert sorted(r.id for r in rows) == sorted(published)
    assert {r.state for r in rows} == {"COMPLETED"}
    assert all(r.error is None for r in rows)
    for r in rows:
        ended = [e["ended"] for e in history(r)]
        assert ended == ["lease_expired"] * (r.deliveries_count - 1)
        assert r.deliveries_count >= 2
    late, done = counters(slow_dir), counters(fast_dir)
    print(f"\nstale lease: slow process {dict(late)}; fast process {dict(done)}")
    # Every late write was refused and counted; none landed (the slow side only rejects).
    assert late["stale"] >= MESSAGES
    assert late["failed"] == late["completed"] == 0
    assert done["completed"] == MESSAGES
    assert done["stale"] == 0
