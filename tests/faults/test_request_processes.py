"""Request/reply across processes, on the three databases: the caller is this test's
process, the handlers run in worker processes (``results=True``), and each request gets the
answer of its own message, from a worker, however the messages are shared out; a failure
comes back as MessageFailed; and a worker SIGKILLed while it runs a request leaves that
request to another worker once its lease expires, whose answer is the one the caller gets
(the killed run's result was never written)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from sqlmq import Broker, MessageFailed, Retry

from ..conftest import wait_until
from .harness import Tables, WorkerPool, WorkerSpec, wait_ready

REQUESTS = 200


def spec(db_url: str, prefix: str, log_dir: Path, **subscriber: Any) -> WorkerSpec:
    return WorkerSpec(url=db_url, prefix=prefix, queue="ask", log_dir=str(log_dir),
                      handler="answer", recovery_interval=0.3, recovery_spread=0.0,
                      subscriber={"results": True, "workers": 8, "flush_interval": 0.02,
                                  "max_fetch_interval": 0.2, "retry": Retry.none(), **subscriber})


@pytest.fixture
async def caller(tables: Tables, db_url: str, prefix: str) -> Any:
    broker = Broker(db_url, table_prefix=prefix)
    try:
        yield broker
    finally:
        await broker.close()


async def test_each_request_gets_its_own_answer_from_a_worker_process(
        caller: Broker, db_url: str, prefix: str, log_dir: Path) -> None:
    pool = WorkerPool(spec(db_url, prefix, log_dir))
    pool.start(2)
    try:
        await asyncio.to_thread(wait_ready, log_dir, 2, 60, [pool])
        answers = await asyncio.gather(*(
            caller.request("ask", {"n": i}, timeout=120) for i in range(REQUESTS)))
        assert [a["echo"] for a in answers] == [{"n": i} for i in range(REQUESTS)]
        assert len({a["id"] for a in answers}) == REQUESTS
        workers = {p.pid for p in pool.live}
        assert {a["pid"] for a in answers} <= workers and os.getpid() not in workers
        with pytest.raises(MessageFailed, match="ValueError: out of paper") as failed:
            await caller.request("ask", {"fail": "out of paper"}, timeout=120)
        assert "Traceback" in (failed.value.error or "")
    finally:
        await asyncio.to_thread(pool.stop)


async def test_a_request_whose_worker_was_killed_is_answered_by_the_next_delivery(
        caller: Broker, db_url: str, prefix: str, log_dir: Path) -> None:
    pool = WorkerPool(spec(db_url, prefix, log_dir, lease=1.0))
    pool.start(1)
    try:
        await asyncio.to_thread(wait_ready, log_dir, 1, 60, [pool])
        request = asyncio.ensure_future(
            caller.request("ask", {"sleep_first": 120}, timeout=120))
        await wait_until(lambda: _processing(caller), message="the request running")
        (victim,) = [p.pid for p in pool.live]
        assert victim is not None
        pool.kill(victim)  # mid-handler: its run never settles; a replacement starts
        answer = await request  # once the lease expired, the next delivery answers
        assert (answer["delivery"], answer["echo"]) == (2, {"sleep_first": 120})
        assert answer["pid"] not in (victim, os.getpid())
        view = await caller.insights().message(answer["id"])
        assert view is not None and (view.state, view.deliveries) == ("COMPLETED", 2)
    finally:
        await asyncio.to_thread(pool.stop)


async def _processing(caller: Broker) -> bool:
    return any(s.processing for s in await caller.stats())
