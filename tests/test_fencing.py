"""Fencing: a handler that outlived its lease cannot archive, retry or overwrite the copy of
its message that was delivered again. Every write after acquisition is conditional on
``(id, deliveries_count, state PROCESSING)``; a late result is dropped and counted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sqlmq import Broker, Message, Outcome, Settlement

from .conftest import on_every_engine, passes, rows, sibling, wait_until

pytestmark = on_every_engine

# A's late decision, and B's decision on the redelivered copy: always a different one, so
# the archive shows whose result landed.
WINNER = {"ack": "reject", "nack": "ack", "reject": "ack"}


async def _decide(msg: Message, decision: str, who: str) -> None:
    if decision == "ack":
        await msg.ack()
    elif decision == "nack":
        await msg.nack(0)
    else:
        await msg.reject(f"rejected by {who}")


@pytest.mark.parametrize("late", ["ack", "nack", "reject"])
async def test_handler_that_outlived_its_lease_cannot_settle_the_redelivered_message(
    broker: Broker, db_url: str, prefix: str, late: str, caplog: pytest.LogCaptureFixture
) -> None:
    a_started, a_release, b_started, b_release = (asyncio.Event() for _ in range(4))
    never = asyncio.Event()
    a_extended: list[bool] = []
    b_deliveries: list[int] = []

    # Subscriber A: one worker, a prefetch of one, no lease renewal. "filler" exists only to
    # fill A's prefetch buffer while its worker is stuck, so A stops fetching and the
    # redelivery can only go to B (otherwise A might take its own message back).
    @broker.subscriber(["contested", "filler"], workers=1, fetch_batch=1, prefetch=1,
                       lease=1.0, renew_leases=False, flush_interval=0.01)
    async def slow_a(msg: Message) -> None:
        if msg.queue == "filler":
            await never.wait()
            return
        a_started.set()
        await a_release.wait()
        a_extended.append(await msg.extend(30))
        await _decide(msg, late, "A")

    b = sibling(broker, db_url, prefix, recovery_interval=0.1, recovery_spread=0)

    @b.subscriber("contested", flush_interval=0.01)
    async def b_handler(msg: Message) -> None:
        b_deliveries.append(msg.deliveries)
        b_started.set()
        await b_release.wait()
        await _decide(msg, WINNER[late], "B")

    msg_id = await broker.publish("contested", {"n": 1})
    await broker.start()
    (runtime_a,) = broker.runtimes
    try:
        await asyncio.wait_for(a_started.wait(), 20)
        filler_id = await broker.publish("filler", "keeps A's buffer full")
        await wait_until(lambda: _state(broker, filler_id, "PROCESSING"),
                         message="A holding the filler in its prefetch buffer")

        await passes(broker, 1.0)  # A's lease runs out (at once on the in-memory engine)
        await b.start()  # B's recovery loop returns the expired delivery; B takes it
        await asyncio.wait_for(b_started.wait(), 30)
        (held_by_b,) = await rows(broker, id=msg_id)
        assert (held_by_b["state"], held_by_b["deliveries_count"]) == ("PROCESSING", 2)
        assert held_by_b["last_error"] == "lease expired"

        a_release.set()  # A's handler finishes late
        await wait_until(lambda: runtime_a.counters.stale >= 1,
                         message="A's late result flushed")
        assert runtime_a.counters.stale == 1
        (warning,) = [r.getMessage() for r in caplog.records
                      if "stale result" in r.getMessage()]
        assert warning == (f"dropped a stale result for message {msg_id} (delivery 1): its "
                           "lease expired and it was delivered again (delivery 2)")
        assert a_extended == [False]
        (still_b,) = await rows(broker, id=msg_id)
        assert dict(still_b) == dict(held_by_b), "A's late result changed B's delivery"
        assert await rows(broker, "archive", id=msg_id) == []

        b_release.set()
        await wait_until(lambda: _archived(broker, msg_id), message="B's result archived")
    finally:
        never.set()
        a_release.set()
        b_release.set()
        await b.close()

    (archived,) = await rows(broker, "archive", id=msg_id)
    winner = WINNER[late]
    assert archived["state"] == ("COMPLETED" if winner == "ack" else "FAILED")
    assert archived["error"] == (None if winner == "ack" else "rejected by B")
    assert archived["deliveries_count"] == 2
    assert archived["attempts_count"] == 1, "A's late attempt was counted"
    assert b_deliveries == [2]
    assert await rows(broker, id=msg_id) == []


async def test_stale_delivery_token_cannot_settle_or_extend_on_the_engine(broker: Broker) -> None:
    engine = broker.engine
    stale_id, fresh_id = await broker.publish_batch("jobs", ["stale", "fresh"])
    first = await engine.acquire(["jobs"], 1, 0.2)
    assert [(d.id, d.deliveries) for d in first] == [(stale_id, 1)]

    recovered: list[int] = []
    await passes(broker, 0.2)

    async def expired_lease_recovered() -> bool:
        recovered.extend(await engine.recover_expired(100))
        return stale_id in recovered

    await wait_until(expired_lease_recovered, message="the expired lease recovered")
    # Recovered but not yet taken again: the old token is already dead.
    pending = await rows(broker, id=stale_id)
    assert await engine.settle(_every_outcome(stale_id, 1)) == set()
    assert await engine.extend([(stale_id, 1)], 300) == set()
    assert await rows(broker, id=stale_id) == pending

    again = await engine.acquire(["jobs"], 10, 30)
    assert sorted((d.id, d.deliveries) for d in again) == [(stale_id, 2), (fresh_id, 1)]
    held = await rows(broker, id=stale_id)
    for settlement in _every_outcome(stale_id, 1):
        assert await engine.settle([settlement]) == set()
    assert await engine.extend([(stale_id, 1)], 300) == set()
    assert await rows(broker, id=stale_id) == held
    assert await rows(broker, "archive") == []

    # In a mixed batch only the rows whose token is current land.
    batch = [Settlement(stale_id, 1, Outcome.COMPLETE), Settlement(fresh_id, 1, Outcome.COMPLETE)]
    assert await engine.settle(batch) == {fresh_id}
    assert await engine.extend([(stale_id, 1), (stale_id, 2)], 60) == {stale_id}
    assert await engine.settle([Settlement(stale_id, 2, Outcome.COMPLETE)]) == {stale_id}
    archived = {r["id"]: r["deliveries_count"] for r in await rows(broker, "archive")}
    assert archived == {stale_id: 2, fresh_id: 1}
    assert await rows(broker) == []


def _every_outcome(msg_id: int, deliveries: int) -> list[Settlement]:
    return [
        Settlement(msg_id, deliveries, Outcome.COMPLETE),
        Settlement(msg_id, deliveries, Outcome.FAIL, error="late"),
        Settlement(msg_id, deliveries, Outcome.RETRY, error="late", delay=0.0),
        Settlement(msg_id, deliveries, Outcome.RELEASE, refund=True, attempted=False),
    ]


async def _state(broker: Broker, msg_id: int, state: str) -> bool:
    found: list[Any] = await rows(broker, id=msg_id)
    return bool(found) and found[0]["state"] == state


async def _archived(broker: Broker, msg_id: int) -> bool:
    return bool(await rows(broker, "archive", id=msg_id))
