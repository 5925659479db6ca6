"""Workflows under SIGKILL, on the three databases: worker processes running a 1,000-step
fan-in and fifty diamonds are killed at random, most often between a handler's return
and its settle, where the settle would release what waits. Every step runs after all its
dependencies completed (its handler reads them), each exactly once per delivery, and none
is left waiting: the release is in the settle's transaction, so a crash leaves both the
dependency and its release undone, and the dependency's next delivery releases."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from sqlalchemy import func, select

from sqlmq import Broker

from .harness import Tables, WorkerPool, WorkerSpec, executions, kill_run, wait_for

FAN_IN = 1000
DIAMONDS = 50
KILLS = 8
_names = itertools.count()


def fan_in(tables: Tables, n: int) -> list[int]:
    """A workflow of ``n`` steps and one that waits for them all; every step's id."""
    flow = Broker(tables.db, table_prefix=tables.prefix).workflow(f"fan-in-{next(_names)}")
    leaves = [flow.add("in", {"leaf": i}, name=f"leaf-{i}") for i in range(n)]
    flow.add("in", {"join": n}, name="join", after=leaves)
    return list(flow.publish_sync().values())


def diamonds(tables: Tables, n: int) -> list[int]:
    """A workflow of ``n`` diamonds: ``a``, then ``b`` and ``c``, then ``d`` after both."""
    flow = Broker(tables.db, table_prefix=tables.prefix).workflow(f"diamonds-{next(_names)}")
    for i in range(n):
        a = flow.add("in", {"a": i}, name=f"a{i}")
        b = flow.add("in", {"b": i}, name=f"b{i}", after=[a])
        c = flow.add("in", {"c": i}, name=f"c{i}", after=[a])
        flow.add("in", {"d": i}, name=f"d{i}", after=[b, c])
    return list(flow.publish_sync().values())


@pytest.mark.slow
def test_sigkilled_workers_run_each_step_once_after_its_dependencies(
    tables: Tables, db_url: str, prefix: str, log_dir: Path
) -> None:
    published = fan_in(tables, FAN_IN) + diamonds(tables, DIAMONDS)
    spec = WorkerSpec(
        url=db_url, prefix=prefix, queue="in", log_dir=str(log_dir), handler="step",
        sleep=0.005, recovery_interval=0.5,
        subscriber={"workers": 8, "fetch_batch": 16, "lease": 2.0, "flush_interval": 0.3,
                    "max_fetch_interval": 0.2},
    )
    run = kill_run(tables, spec, published, workers=3, min_kills=KILLS,
                   interval=(0.15, 0.35), top_up=lambda: diamonds(tables, 50))
    o = run.outcome
    print(f"\nworkflow kill test: {run.kills} kills, {len(published)}"
          f" steps, {o.duplicate_executions} runs whose settle never landed")
    assert run.kills >= KILLS
    o.assert_each_completed_once()  # nothing left waiting, nothing lost, no double archive
    assert [e for e in executions(log_dir) if e[2] == "early"] == []
    s = tables.schema.step
    with tables.db.connect() as conn:
        statuses = dict(conn.execute(select(s.c.status, func.count()).group_by(s.c.status))
                        .all())
    assert statuses == {"RELEASED": len(published)}


@pytest.mark.slow
def test_a_failure_in_another_process_cancels_the_subtree_that_waits_on_it(
    tables: Tables, db_url: str, prefix: str, log_dir: Path
) -> None:
    """Thirty workflows run by three worker processes: in each odd one the first step
    fails, which cancels the chain after it (``b``, then ``c``) while ``d``, which runs on
    failure, runs; every even one completes."""
    broker = Broker(tables.db, table_prefix=tables.prefix)
    for i in range(30):
        flow = broker.workflow(f"w{i}")
        a = flow.add("in", {"fail": i % 2 == 1}, name="a")
        b = flow.add("in", {"b": i}, name="b", after=[a])
        flow.add("in", {"c": i}, name="c", after=[b])
        flow.add("in", {"d": i}, name="d", after=[a], on_failure="run")
        flow.publish_sync()
    spec = WorkerSpec(url=db_url, prefix=prefix, queue="in", log_dir=str(log_dir),
                      handler="step", subscriber={"workers": 4, "flush_interval": 0.05,
                                                  "max_fetch_interval": 0.2})
    pool = WorkerPool(spec)
    pool.start(3)
    try:
        wait_for(lambda: tables.left("in") == 0, 120,
                 lambda: f"{tables.left('in')} steps left", watch=[pool])
    finally:
        pool.stop()
    s, a = tables.schema.step, tables.schema.archive
    with tables.db.connect() as conn:
        found = conn.execute(select(s.c.workflow, s.c.name, a.c.state, a.c.error)
                             .select_from(s.join(a, a.c.id == s.c.id))).all()
    by_flow: dict[str, dict[str, str]] = {}
    for flow_name, step, state, _ in found:
        by_flow.setdefault(flow_name, {})[step] = state
    for i in range(30):
        want = ({"a": "FAILED", "b": "CANCELLED", "c": "CANCELLED", "d": "COMPLETED"}
                if i % 2 else {"a": "COMPLETED", "b": "COMPLETED", "c": "COMPLETED",
                               "d": "COMPLETED"})
        assert by_flow[f"w{i}"] == want, i
    reasons = {(f, step): error for f, step, _, error in found if step == "b"}
    assert all("dependency a" in (reasons[f"w{i}", "b"] or "") for i in range(1, 30, 2))
