"""Kill test: worker processes are SIGKILLed at random while they drain a queue.

At least once, by the book: every message ends in the archive exactly once, none is lost or
left behind, and a handler runs twice only for a message whose delivery count shows the
redelivery. ``SQLMQ_KILL_MESSAGES`` sets the size (the issue's 100,000 runs in
``bench/kill_test.py``); if the queue runs dry before ``SQLMQ_KILL_MIN_KILLS`` kills, the
driver publishes more, so the kills always land on a working queue.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from .harness import (
    Tables,
    WorkerPool,
    WorkerSpec,
    executions,
    history,
    kill_run,
    wait_for,
    wait_ready,
)

MESSAGES = int(os.environ.get("SQLMQ_KILL_MESSAGES", "2000"))
MIN_KILLS = int(os.environ.get("SQLMQ_KILL_MIN_KILLS", "50"))


@pytest.mark.slow
def test_sigkilled_workers_lose_nothing_and_archive_each_message_exactly_once(
    tables: Tables, db_url: str, prefix: str, log_dir: Path
) -> None:
    published = tables.publish("jobs", ({"n": i} for i in range(MESSAGES)))
    spec = WorkerSpec(
        url=db_url, prefix=prefix, queue="jobs", log_dir=str(log_dir), sleep=0.01,
        recovery_interval=0.5,
        subscriber={"workers": 8, "fetch_batch": 16, "lease": 3.0, "flush_interval": 0.05,
                    "max_fetch_interval": 0.2},
    )
    run = kill_run(tables, spec, published, min_kills=MIN_KILLS, interval=(0.15, 0.35),
                   top_up=lambda: tables.publish("jobs", ({"more": i} for i in range(500))))
    o = run.outcome
    print(f"\nkill test: {run.kills} kills in {run.seconds_under_fire:.1f}s "
          f"({run.archived_under_fire} archived under fire), drained "
          f"{run.seconds_to_drain:.1f}s later; {o.as_dict()}")

    assert run.kills >= MIN_KILLS
    assert o.published == len(published)
    o.assert_each_completed_once()
    assert o.redelivered > 0  # the kills did cut deliveries short


@pytest.mark.slow
def test_long_handler_keeps_its_lease_while_its_process_lives_and_is_redelivered_after_sigkill(
    tables: Tables, db_url: str, prefix: str, log_dir: Path
) -> None:
    # A lease of 2.5 s, not 1 s: beside the suite on two cores a worker process stalled long
    # enough for a 1 s lease to run out before its renewal landed (its rival then took the
    # message over within the four leases), which is the starved process the lease is for.
    lease = 2.5
    (msg_id,) = tables.publish("jobs", ["long"])
    spec = WorkerSpec(
        url=db_url, prefix=prefix, queue="jobs", log_dir=str(log_dir), handler="slow_first",
        sleep=3600, recovery_interval=0.2,
        subscriber={"lease": lease, "flush_interval": 0.02, "max_fetch_interval": 0.1},
    )
    first, second = WorkerPool(spec), WorkerPool(spec)
    deadline = time.monotonic() + 120
    try:
        first.start()
        wait_for(lambda: tables.processing() >= 1, deadline - time.monotonic(),
                 "the first worker did not take the message", [first], poll=0.02)
        second.start()  # a rival with its own recovery loop, ready to take the message over
        wait_ready(log_dir, 2, watch=[first, second])
        time.sleep(4 * lease)  # renewed by the first worker's lease keeper meanwhile
        (row,) = tables.message_rows()
        assert (row.state, row.deliveries_count) == ("PROCESSING", 1)

        killed = time.monotonic()
        first.kill_random()  # SIGKILL; its replacement and the rival share what is left
        wait_for(lambda: tables.left() == 0, deadline - time.monotonic(),
                 "the message was not delivered again", [first, second], poll=0.02)
        print(f"\nredelivered and completed {time.monotonic() - killed:.1f}s after SIGKILL "
              f"(lease {lease}s, recovery every 0.2s)")
    finally:
        first.stop()
        second.stop()

    (done,) = tables.archive_rows()
    assert (done.id, done.state, done.deliveries_count) == (msg_id, "COMPLETED", 2)
    assert [(e["delivery"], e["ended"]) for e in history(done)] == [(1, "lease_expired")]
    assert [(i, d) for i, d, _ in executions(log_dir)] == [(msg_id, 2)]
