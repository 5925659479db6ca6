"""Poison: a message whose handler kills its process. A supervisor restarts the dead worker;
``max_deliveries`` stops the poison, which is archived FAILED with the history of its lease
expiries, and every other message is processed. Quarantine keeps the poison's crashes from
being charged to the messages prefetched beside it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sqlmq.runtime.quarantine import QUARANTINE_AFTER

from .harness import (
    Tables,
    WorkerPool,
    WorkerSpec,
    executions,
    history,
    lost_leases,
    wait_ready,
)

MAX_DELIVERIES = 4


@pytest.mark.slow
def test_message_that_kills_its_process_is_stopped_by_max_deliveries_and_the_rest_is_handled(
    tables: Tables, db_url: str, prefix: str, log_dir: Path
) -> None:
    good = tables.publish("jobs", ({"n": i} for i in range(30)))
    (poison,) = tables.publish("jobs", ["poison"])
    good += tables.publish("jobs", ({"n": i} for i in range(30, 60)))
    spec = WorkerSpec(
        url=db_url, prefix=prefix, queue="jobs", log_dir=str(log_dir), handler="poison",
        # No spread and a prefetch as big as the queue: the poison's neighbours come back
        # and are fetched with it after every crash, unless quarantine keeps them apart.
        sleep=0.01, recovery_interval=0.2, recovery_spread=0.0,
        subscriber={"workers": 4, "fetch_batch": 40, "lease": 1.5, "flush_interval": 0.02,
                    "max_fetch_interval": 0.1, "max_deliveries": MAX_DELIVERIES},
    )
    pool = WorkerPool(spec)
    pool.start(2)
    deadline = time.monotonic() + 120
    try:
        wait_ready(log_dir, 1)
        while tables.left() > 0:  # supervise: a worker that died is replaced
            assert time.monotonic() < deadline, f"{tables.left()} messages left after 120s"
            pool.replace_dead()
            time.sleep(0.05)
    finally:
        pool.stop()

    rows = {r.id: r for r in tables.archive_rows()}
    assert set(rows) == {*good, poison}
    bad = rows[poison]
    assert bad.state == "FAILED"
    assert bad.deliveries_count == MAX_DELIVERIES + 1
    assert "max deliveries" in bad.error
    endings = [(e["delivery"], e["ended"]) for e in history(bad)]
    assert endings == [(1, "lease_expired"), (2, "lease_expired"), (3, "lease_expired"),
                       (4, "lease_expired"), (5, "max_deliveries")]
    deaths = [run for run in executions(log_dir) if run[2] == "died"]
    assert sorted(d for _, d, _ in deaths) == [1, 2, 3, 4]
    assert pool.deaths >= 1  # the supervisor saw them die (some may die between its checks)
    assert {rows[i].state for i in good} == {"COMPLETED"}
    # From its QUARANTINE_AFTER-th expiry on, the poison runs alone: its later crashes hold
    # no other message, so a neighbour is charged at most QUARANTINE_AFTER deliveries. A
    # delivery whose lease a living worker lost is not a crash's charge: under the parallel
    # suite a worker running its neighbours (each a suspect too, so each alone, in turn)
    # once renewed 1.5 s leases too late, and one neighbour came back a fourth time.
    lost = lost_leases(log_dir)
    charged = {i: rows[i].deliveries_count - 1 - sum(1 for m, _ in lost if m == i)
               for i in good}
    assert max(charged.values()) <= QUARANTINE_AFTER, charged
