"""Pipeline atomicity under SIGKILL: worker processes of a step (``publish_to="out"``) are
killed at random while they drain its queue, most often while a handler has returned and its
result waits for the next flush (half a second apart), so between the handler's return and
the settle; some mid-settle. The hop is exactly-once all the same: every input is archived
COMPLETED once, and ``out`` holds exactly one output per archived input, none for a run
whose settle never landed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from .harness import Tables, WorkerSpec, kill_run

MESSAGES = 1500
KILLS = 20


@pytest.mark.slow
def test_sigkilled_pipeline_steps_publish_each_output_exactly_once(
    tables: Tables, db_url: str, prefix: str, log_dir: Path
) -> None:
    published = tables.publish("in", ({"n": i} for i in range(MESSAGES)))
    spec = WorkerSpec(
        url=db_url, prefix=prefix, queue="in", log_dir=str(log_dir), handler="pipeline",
        sleep=0.01, recovery_interval=0.5,
        subscriber={"publish_to": "out", "workers": 8, "fetch_batch": 16, "lease": 2.0,
                    "flush_interval": 0.5, "max_fetch_interval": 0.2},
    )
    run = kill_run(tables, spec, published, workers=3, min_kills=KILLS,
                   interval=(0.15, 0.35),
                   top_up=lambda: tables.publish("in", ({"more": i} for i in range(300))))
    o = run.outcome
    outputs = Counter(json.loads(r.payload)["from"] for r in tables.message_rows("out"))
    completed = {r.id for r in tables.archive_rows() if r.state == "COMPLETED"}
    print(f"\npipeline kill test: {run.kills} kills, {o.duplicate_executions} runs whose "
          f"settle never landed, {sum(outputs.values())} outputs for {len(completed)} "
          f"archived inputs")

    assert run.kills >= KILLS
    assert (o.archived, o.left, o.lost, o.double_archived) == (len(published), 0, 0, 0)
    assert o.completed == len(published) == len(completed)
    assert set(outputs) == completed  # an output for every archived input, and no other
    assert [n for n in outputs.values() if n > 1] == []  # and only one
    # The kills did land between a handler's return and its settle: those runs were
    # recorded, their deliveries never settled, and their messages ran again.
    assert o.duplicate_executions > 0
    assert o.delivery_executed_twice == 0
