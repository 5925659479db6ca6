"""MariaDB: acquire, settle and publish running side by side on a small table must not
deadlock. With few rows the optimizer would rather scan the message table than look the
batch's ids up, and a scan locks rows outside the batch; the statements force the batch to
drive the join by primary key (``sqlmq/engines/mysql/engine.py``)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sqlmq import Broker, Message

from .conftest import wait_until


@pytest.mark.parametrize("db_kind", ["mariadb"])
async def test_steady_publishing_to_a_small_queue_never_deadlocks(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sqlmq")
    await broker.publish("idle", "a row the batches never include")
    handled: list[int] = []

    @broker.subscriber("jobs", flush_interval=0.005)
    async def handle(msg: Message) -> None:
        handled.append(msg.id)

    await broker.start()
    try:
        ids = []
        for _ in range(300):
            ids.append(await broker.publish("jobs", "x"))
            await asyncio.sleep(0.003)
        await wait_until(lambda: len(handled) == len(ids), message="every message handled")
    finally:
        await broker.stop()
    problems = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert problems == []
