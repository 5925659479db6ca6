"""Quarantine through the broker, on every engine: messages whose last deliveries all ended
in an expired lease (suspects: perhaps each kills its process) run one at a time, alone,
and isolating each hands back only what that needs, however many suspects follow. The
isolation itself is tested on a scripted engine in ``tests/test_runtime_services.py`` and
with processes that really die in ``tests/faults/test_poison.py``."""

from __future__ import annotations

import asyncio

from sqlmq import Broker, Message
from sqlmq.runtime.fetcher import FETCH_FLOOR
from sqlmq.runtime.quarantine import QUARANTINE_AFTER

from .conftest import drained, on_every_engine, passes, rows, wait_until

pytestmark = on_every_engine

SUSPECTS = 24


async def _expire_all(broker: Broker, queue: str, n: int) -> None:
    """Every message of ``queue`` delivered on a lease that ends at once, and recovered: as
    if the process holding them had died."""
    taken = await broker.engine.acquire([queue], n, 0.001)
    assert len(taken) == n
    await passes(broker, 0.05)
    recovered: set[int] = set()

    async def all_recovered() -> bool:
        recovered.update(await broker.engine.recover_expired(n))
        return len(recovered) == n

    await wait_until(all_recovered, message="every expired lease recovered")


async def test_a_run_of_suspects_hands_back_a_batch_once_not_one_per_suspect(
        broker: Broker) -> None:
    """After repeated crashes the suspects come in runs. Each runs alone, with what the
    process holds handed back; a full batch fetched after each one was handed back for the
    next (24 suspects: 268 hand-backs, 11 a suspect). The first suspect's batch is handed
    back, and what is fetched after a suspect is small: an acquire of one or two, handed
    back only if it was out when the next suspect began (here, usually, none is: each
    acquire of one brings the next suspect, which closes the gate before the fetcher
    acquires again)."""
    ids = await broker.publish_batch("jobs", list(range(SUSPECTS)))
    for _ in range(QUARANTINE_AFTER):
        await _expire_all(broker, "jobs", SUSPECTS)
    alone: list[bool] = []
    running = 0

    @broker.subscriber("jobs", workers=4, fetch_batch=100, flush_interval=0.01)
    async def handle(msg: Message) -> None:
        nonlocal running
        running += 1
        alone.append(running == 1)
        await asyncio.sleep(0)  # another handler would start now, if one could
        running -= 1

    await broker.start()
    (runtime,) = broker.runtimes
    try:
        await wait_until(lambda: drained(broker, "jobs"), message="every suspect handled")
    finally:
        await broker.stop()
    archived = await rows(broker, "archive")
    assert sorted(r["id"] for r in archived) == sorted(ids)
    assert {r["state"] for r in archived} == {"COMPLETED"}
    assert len(alone) == SUSPECTS and all(alone)
    first_batch = FETCH_FLOOR  # the first acquire's size: all of it but the first suspect
    assert runtime.counters.released <= first_batch - 1 + 2 * SUSPECTS, runtime.counters
    assert runtime.counters.acquired == SUSPECTS + runtime.counters.released
