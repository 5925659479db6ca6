"""Signals across processes, on the three databases: three worker processes take 120
messages whose handlers wait for a signal (``msg.wait_for``), and this process sends each
its signal once it waits, in a random order: every message runs again once, reads its own
signal, and completes; none is woken by another's signal or left waiting."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from sqlmq import Broker

from .harness import Tables, WorkerPool, WorkerSpec, executions, outcome, wait_for, wait_ready

MESSAGES = 120


@pytest.mark.slow
def test_signals_sent_from_another_process_wake_each_waiting_message_once(
    tables: Tables, db_url: str, prefix: str, log_dir: Path
) -> None:
    published = tables.publish("in", ({"n": i} for i in range(MESSAGES)))
    spec = WorkerSpec(url=db_url, prefix=prefix, queue="in", log_dir=str(log_dir),
                      handler="await_signal",
                      subscriber={"workers": 8, "fetch_batch": 16, "flush_interval": 0.05,
                                  "max_fetch_interval": 0.2})
    pool = WorkerPool(spec)
    pool.start(3)
    try:
        wait_ready(log_dir, 3, watch=[pool])

        def waiting() -> int:
            return sum(1 for _, _, note in executions(log_dir) if note == "waits")

        wait_for(lambda: waiting() >= MESSAGES, 120, lambda: f"{waiting()} waiting",
                 watch=[pool])
        order = list(published)
        random.shuffle(order)
        sent = asyncio.run(_signal_each(db_url, prefix, order))
        assert sent == [True] * MESSAGES
        wait_for(lambda: tables.left("in") == 0, 120,
                 lambda: f"{tables.left('in')} messages left", watch=[pool])
    finally:
        pool.stop()
    notes = Counter((i, note) for i, _, note in executions(log_dir))
    assert {i for (i, note) in notes if note == "got"} == set(published)
    assert [k for k, n in notes.items() if n > 1] == []  # each woke once, with its own
    assert [k for k in notes if k[1] == "wrong"] == []
    o = outcome(tables, published, log_dir, "in")
    assert (o.completed, o.left, o.lost) == (MESSAGES, 0, 0)


async def _signal_each(url: str, prefix: str, ids: list[int]) -> list[bool]:
    async with Broker(url, table_prefix=prefix) as broker:
        return [await broker.signal(i, "go", {"for": i}) for i in ids]
