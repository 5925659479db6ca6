"""Batch handlers under SIGKILL: worker processes running batches (``batch=20``) are killed
at random while they drain a queue, most often while a batch runs or its results wait for
the next flush. Each message of a batch is still its own delivery: every message is
archived exactly once, none lost, and a handler runs a message again only on a new
delivery. A batch pipeline step publishes its outputs in the settle of its batch: exactly
one output per archived input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from .harness import Tables, WorkerSpec, kill_run

MESSAGES = 2000
KILLS = 20
BATCH = {"batch": 20, "batch_wait": 0.05, "workers": 4, "fetch_batch": 40, "lease": 3.0,
         "max_fetch_interval": 0.2}


@pytest.mark.slow
def test_sigkilled_batch_handlers_archive_each_message_exactly_once(
    tables: Tables, db_url: str, prefix: str, log_dir: Path
) -> None:
    published = tables.publish("jobs", ({"n": i} for i in range(MESSAGES)))
    spec = WorkerSpec(url=db_url, prefix=prefix, queue="jobs", log_dir=str(log_dir),
                      handler="batch", sleep=0.05, recovery_interval=0.5,
                      subscriber={**BATCH, "flush_interval": 0.05})
    run = kill_run(tables, spec, published, workers=3, min_kills=KILLS, interval=(0.15, 0.35),
                   top_up=lambda: tables.publish("jobs", ({"more": i} for i in range(500))))
    o = run.outcome
    print(f"\nbatch kill test: {run.kills} kills; {o.as_dict()}")

    assert run.kills >= KILLS
    assert o.published == len(published)
    o.assert_each_completed_once()
    assert o.redelivered > 0  # the kills did cut batches short


@pytest.mark.slow
def test_sigkilled_batch_pipeline_steps_publish_each_output_exactly_once(
    tables: Tables, db_url: str, prefix: str, log_dir: Path
) -> None:
    published = tables.publish("in", ({"n": i} for i in range(MESSAGES)))
    spec = WorkerSpec(url=db_url, prefix=prefix, queue="in", log_dir=str(log_dir),
                      handler="batch_pipeline", sleep=0.02, recovery_interval=0.5,
                      subscriber={**BATCH, "publish_to": "out", "flush_interval": 0.5})
    run = kill_run(tables, spec, published, workers=3, min_kills=KILLS, interval=(0.15, 0.35),
                   top_up=lambda: tables.publish("in", ({"more": i} for i in range(500))))
    o = run.outcome
    outputs = Counter(json.loads(r.payload)["from"] for r in tables.message_rows("out"))
    completed = {r.id for r in tables.archive_rows() if r.state == "COMPLETED"}
    print(f"\nbatch pipeline kill test: {run.kills} kills, {o.duplicate_executions} runs "
          f"whose settle never landed, {sum(outputs.values())} outputs for "
          f"{len(completed)} archived inputs")

    assert run.kills >= KILLS
    assert (o.archived, o.left, o.lost, o.double_archived) == (len(published), 0, 0, 0)
    assert o.completed == len(published) == len(completed)
    assert set(outputs) == completed  # an output for every archived input, and no other
    assert [n for n in outputs.values() if n > 1] == []  # and only one
    assert o.duplicate_executions > 0  # kills landed between a batch's return and its settle
    assert o.delivery_executed_twice == 0
