"""A settle whose reply is lost: the server committed it, then the connection died before
the client read the answer (a database restart during a flush, a killed connection).

The runtime retries the batch; its rows are no longer PROCESSING, so the engine leaves them
out exactly as it leaves out a stale result. Those results were the runtime's own: they must
be counted (completed, failed, retried), not dropped as stale with a warning that the lease
expired. Found as the MariaDB restart test timing out under load: a flush cut by the restart
had archived its batch, the counter of completed messages never reached the total.

The fault is injected at the engine contract (the real statement runs on the real database,
then the reply is "lost"), the one spot where it can be placed deterministically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from sqlmq import AckPolicy, Broker, Message, Retry
from sqlmq.lifecycle import Outcome
from sqlmq.records import Settlement

from .conftest import on_every_engine, passes, rows, speed_up, wait_until

pytestmark = on_every_engine

N = 20


def lose_first_reply(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the first settle that writes something commit, then fail as if the connection
    died before its reply arrived. Returns the ids that batch wrote (once it has run)."""
    engine = broker.engine
    real = engine.settle
    lost: list[int] = []

    async def settle(batch: Sequence[Settlement]) -> set[int]:
        applied = await real(batch)
        if applied and not lost:
            lost.extend(applied)
            raise ConnectionResetError("connection lost before the reply to COMMIT arrived")
        return applied

    monkeypatch.setattr(engine, "settle", settle)
    return lost


@pytest.mark.parametrize("outcome", ["completed", "failed", "retried"])
async def test_a_settle_that_committed_before_its_reply_was_lost_counts_its_results(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    lost = lose_first_reply(broker, monkeypatch)

    @broker.subscriber("q", workers=4, flush_interval=0.01, retry=Retry.constant(3600),
                       ack_policy=AckPolicy.REJECT_ON_ERROR if outcome == "failed"
                       else AckPolicy.NACK_ON_ERROR)
    async def handle(msg: Message) -> None:
        if outcome != "completed":
            raise RuntimeError("refused")

    ids = await broker.publish_batch("q", range(N))
    await broker.start()
    counters = broker.runtimes[0].counters
    await wait_until(lambda: getattr(counters, outcome) + counters.stale >= N, timeout=30,
                     message=f"every result counted {outcome} or stale")
    await broker.stop()

    assert lost, "the injected fault never fired"
    assert (getattr(counters, outcome), counters.stale) == (N, 0)
    if outcome == "retried":
        left = await rows(broker, "message")
        assert [(r["id"], r["state"], r["deliveries_count"]) for r in left] == [
            (i, "RETRYABLE", 1) for i in ids]
    else:
        archived = await rows(broker, "archive")
        assert [(r["id"], r["state"], r["deliveries_count"]) for r in archived] == [
            (i, outcome.upper(), 1) for i in ids]


async def test_landed_tells_written_results_from_stale_ones(broker: Broker) -> None:
    """``landed`` recognises each kind of result as written by its own delivery, and none
    of a delivery whose lease expired and was recovered instead."""
    engine = broker.engine
    ids = await broker.publish_batch("q", range(6))
    d = {x.id: x for x in await engine.acquire(["q"], 6, 30)}
    done = [
        Settlement(ids[0], d[ids[0]].deliveries, Outcome.COMPLETE),
        Settlement(ids[1], d[ids[1]].deliveries, Outcome.FAIL, error="no"),
        Settlement(ids[2], d[ids[2]].deliveries, Outcome.RETRY, delay=3600),
        Settlement(ids[3], d[ids[3]].deliveries, Outcome.RELEASE, refund=True,
                   attempted=False),
        Settlement(ids[4], d[ids[4]].deliveries, Outcome.RELEASE, error="cancelled",
                   attempted=False),
    ]
    assert await engine.landed(done) == set()  # nothing written yet
    assert await engine.settle(done) == set(ids[:5])
    assert await engine.landed(done) == set(ids[:5])

    # The sixth: its lease runs out and recovery takes it back; none of its results landed.
    late = d[ids[5]]
    await engine.extend([(late.id, late.deliveries)], 0.05)
    await passes(broker, 0.3)
    assert ids[5] in await engine.recover_expired(100)
    never = [Settlement(late.id, late.deliveries, o, attempted=False)
             for o in (Outcome.COMPLETE, Outcome.RETRY, Outcome.RELEASE)]
    for s in never:
        assert await engine.landed([s]) == set(), s.outcome


async def test_a_passing_settle_whose_reply_was_lost_loses_nothing(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A settle that passed a freed channel slot on (``settle_passing``) commits, and its
    reply is lost: its result is found landed, and the message it started, which no worker
    ever got, comes back when its lease expires, as after a crash, and runs then."""
    engine = broker.engine
    real = engine.settle_passing
    orphans: list[int] = []

    async def settle_passing(batch: Sequence[Settlement], *args: Any,
                             ) -> tuple[set[int], list[Any]]:
        applied, started = await real(batch, *args)
        if started and not orphans:
            orphans.extend(d.id for d in started)
            raise ConnectionResetError("connection lost before the reply to COMMIT arrived")
        return applied, started

    monkeypatch.setattr(engine, "settle_passing", settle_passing)
    speed_up(broker)
    starts: list[int] = []

    @broker.subscriber("q", workers=4, lease=1.0, recovery_interval=0.2,
                       flush_interval=0.0, max_fetch_interval=0.05)
    async def handle(msg: Message) -> None:
        starts.append(msg.id)

    await broker.set_channel("one", max_concurrency=1)
    ids = await broker.publish_batch("q", range(4), channel="one")
    await broker.start()
    counters = broker.runtimes[0].counters
    await wait_until(lambda: counters.completed >= len(ids), timeout=30,
                     message="every message completed")
    await broker.stop()

    assert len(orphans) == 1, "the injected fault never fired"
    assert sorted(set(starts)) == ids and counters.stale == 0
    archived = await rows(broker, "archive")
    assert sorted(r["id"] for r in archived) == ids
    # the orphan was delivered twice: once to no one (the lost reply), once to a worker
    assert {r["id"]: r["deliveries_count"] for r in archived} == {
        i: 2 if i == orphans[0] else 1 for i in ids}
