"""Leases: a delivery whose holder vanished comes back after its lease; a live holder keeps
its lease for as long as its handler runs; a handler can push its own lease forward."""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sqlmq import Broker, Message

from .conftest import LoopStalls, on_every_engine, rows, wait_until
from .procs import spawn_worker


async def test_expired_lease_returns_message_to_pending_with_history_and_redelivers_it(
    broker: Broker, db_url: str, prefix: str, tmp_path: Path
) -> None:
    msg_id = await broker.publish("jobs", {"n": 1})
    # A real worker process takes the message (1s lease) and dies holding it.
    holder = spawn_worker(db_url, prefix, "jobs", tmp_path / "holder.ids", sleep=3600, lease=1.0)
    try:
        await wait_until(lambda: _in_state(broker, msg_id, "PROCESSING"), timeout=60,
                         message="the worker process holding the message")
    finally:
        holder.kill()
        holder.wait(30)

    recovering = Broker(db_url, table_prefix=prefix, recovery_interval=0.1)

    @recovering.subscriber("unrelated")  # a broker runs its recovery loop while subscribed
    async def unrelated(msg: Message) -> None: ...

    redelivered: list[Message] = []
    try:
        await recovering.start()
        await wait_until(lambda: _in_state(broker, msg_id, "PENDING"),
                         message="the expired delivery back in PENDING")
        (pending,) = await rows(broker, id=msg_id)
        assert pending["deliveries_count"] == 1
        assert pending["attempts_count"] == 0
        assert pending["last_error"] == "lease expired"
        assert pending["lease_expires_at"] is None
        assert pending["next_attempt_at"] is not None
        *_, entry = pending["history"]
        assert {k: entry[k] for k in ("delivery", "ended")} == {
            "delivery": 1, "ended": "lease_expired"}
        assert datetime.fromisoformat(entry["at"]).tzinfo is not None

        @recovering.subscriber("jobs", flush_interval=0.01)
        async def second_chance(msg: Message) -> None:
            redelivered.append(msg)

        await wait_until(lambda: _archived(broker, msg_id), message="the redelivery archived")
    finally:
        await recovering.close()

    assert [(m.id, m.deliveries) for m in redelivered] == [(msg_id, 2)]
    assert redelivered[0].history[-1]["ended"] == "lease_expired"
    (archived,) = await rows(broker, "archive", id=msg_id)
    assert (archived["state"], archived["deliveries_count"]) == ("COMPLETED", 2)
    assert archived["attempts_count"] == 1


async def test_renewed_lease_outlives_a_handler_three_times_longer_than_the_lease(
    db_url: str, prefix: str, broker: Broker
) -> None:
    """Renewed every third of the lease, a handler three leases long keeps it. Unless the
    process itself stalled for a quarter of a lease (the suite's five processes, their
    workers and both databases on two cores did it once): then a handler whose renewal
    could not come back in time is cancelled before the lease ends, counted, and its
    message runs again and is archived once, as designed. A keeper that fails while the
    loop runs on time fails the test."""
    lease = 2.0
    b = Broker(db_url, table_prefix=prefix, recovery_interval=0.1)
    calls: list[tuple[int, int]] = []

    @b.subscriber("long", lease=lease, flush_interval=0.01)  # renew_leases=True by default
    async def long_running(msg: Message) -> None:
        calls.append((msg.id, msg.deliveries))
        await asyncio.sleep(3 * lease)

    ids = await b.publish_batch("long", ["a", "b"])
    async with LoopStalls() as stalls:
        try:
            await b.start()
            (runtime,) = b.runtimes
            await wait_until(lambda: _archived(broker, *ids), timeout=60,
                             message="both archived")
        finally:
            await b.close()

    counters = runtime.counters
    archived = await rows(broker, "archive")
    runs = {i: sum(1 for c, _ in calls if c == i) for i in ids}
    assert [(r["id"], r["state"], r["deliveries_count"]) for r in archived] == [
        (i, "COMPLETED", runs[i]) for i in ids]
    assert counters.stale == 0
    if stalls.worst < lease / 4:  # a late renewal needs a stall of a third of a lease
        assert sorted(calls) == [(i, 1) for i in ids]
        assert (counters.lost_leases, counters.late_renewals) == (0, 0)
    else:  # the process stalled: every delivery after a message's first was a lost lease
        assert counters.lost_leases == len(calls) - len(ids)


@on_every_engine
async def test_extend_pushes_the_lease_forward_on_the_database(broker: Broker) -> None:
    seen: dict[str, Any] = {}

    @broker.subscriber("slow", lease=5.0, renew_leases=False, flush_interval=0.01)
    async def takes_its_time(msg: Message) -> None:
        (before,) = await rows(broker, id=msg.id)
        seen["extended"] = await msg.extend(120)
        (after,) = await rows(broker, id=msg.id)
        seen["now"] = await broker.engine.now()
        seen["before"], seen["after"] = before["lease_expires_at"], after["lease_expires_at"]

    msg_id = await broker.publish("slow", "x")
    await broker.start()
    await wait_until(lambda: _archived(broker, msg_id), message="the message archived")
    await broker.stop()

    assert seen["extended"] is True
    assert (seen["before"] - seen["now"]).total_seconds() <= 5
    assert 60 < (seen["after"] - seen["now"]).total_seconds() <= 120


async def _in_state(broker: Broker, msg_id: int, state: str) -> bool:
    found = await rows(broker, id=msg_id)
    return bool(found) and found[0]["state"] == state


async def _archived(broker: Broker, *ids: int) -> bool:
    return {r["id"] for r in await rows(broker, "archive")} >= set(ids)


@on_every_engine
async def test_a_handler_whose_lease_could_not_be_renewed_is_cancelled_before_it_runs_twice(
    broker: Broker, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The database stalls every extension for longer than the lease (out of reach, or a
    writer starved of SQLite's lock): the runtime cannot know whether the lease still
    holds, so at the lease's end it cancels the handler, writes nothing, and the message is
    delivered again after the lease ends, never beside its first delivery; the warning says
    which (here a renewal that has not come back)."""
    caplog.set_level(logging.WARNING, logger="sqlmq")
    lease = 1.0
    real_extend = broker.engine.extend
    stalled = [True]

    async def stalled_extend(leases: Any, seconds: float) -> Any:
        if stalled[0]:
            await asyncio.sleep(3 * lease)
        return await real_extend(leases, seconds)

    monkeypatch.setattr(broker.engine, "extend", stalled_extend)
    loop = asyncio.get_running_loop()
    runs: list[list[Any]] = []  # [deliveries, start, end or None]

    @broker.subscriber("slow", lease=lease, flush_interval=0.01, recovery_interval=0.1)
    async def slow(msg: Message) -> None:
        run = [msg.deliveries, loop.time(), None]
        runs.append(run)
        if msg.deliveries == 1:
            await asyncio.sleep(10 * lease)  # far past the lease: cut short at its end
        else:
            stalled[0] = False
        run[2] = loop.time()

    msg_id = await broker.publish("slow", "x")
    await broker.start()
    (runtime,) = broker.runtimes
    try:
        await wait_until(lambda: _archived(broker, msg_id), timeout=30,
                         message="the message archived by its second delivery")
    finally:
        await broker.stop()

    assert runtime.counters.lost_leases == 1 and runtime.counters.stale == 0
    (warning,) = [m for m in (r.getMessage() for r in caplog.records)
                  if "cancelled: its lease" in m]
    assert re.search(r"lease 1\.0s; a renewal sent \d\.\d\ds ago has not come back",
                     warning), warning
    (first, second) = runs
    assert (first[0], first[2]) == (1, None)  # cancelled, never finished
    assert second[0] == 2 and second[1] - first[1] >= lease  # after the lease, not beside it
    (archived,) = await rows(broker, "archive", id=msg_id)
    assert (archived["state"], archived["deliveries_count"]) == ("COMPLETED", 2)
    assert [e["ended"] for e in archived["history"]][:1] == ["lease_expired"]
