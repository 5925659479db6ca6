"""The engines' hot path (acquire and settle sent straight on the driver, rows decoded by
hand): what each returns, down to the microsecond of every timestamp, the order of a batch,
the driver-free fallback on MariaDB, and what a statement failing half way through a
transaction leaves behind (nothing: no rows changed, no lock held, the next call works)."""

from __future__ import annotations

import asyncio
from datetime import UTC, timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import DBAPIError

from sqlmq import Broker, Outcome, Settlement

from .conftest import on_every_engine, rows, update_row


@pytest.fixture(params=["sqlite", "mariadb", "postgresql"])
def db_kind(request: pytest.FixtureRequest) -> str:
    return request.param


async def _backdate(broker: Broker, ids: list[int]) -> None:
    """Make ``ids`` ready in the reverse order of their ids, a second apart."""
    now = await broker.engine.now()
    for k, msg_id in enumerate(ids):
        await update_row(broker, msg_id, next_attempt_at=now - timedelta(seconds=10 + len(ids) - k))


@on_every_engine  # the in-memory engine returns the same
async def test_acquire_returns_ready_order_fields_and_leases(broker: Broker) -> None:
    ids = await broker.publish_batch("q", [b"a", b"b", b"c", b"d"], headers={"k": "v"})
    await _backdate(broker, list(reversed(ids)))
    before = await broker.engine.now()

    got = await broker.engine.acquire(["q", "other"], 3, 30)

    assert [d.id for d in got] == list(reversed(ids))[:3]
    assert [d.payload for d in got] == [b"d", b"c", b"b"]
    now = await broker.engine.now()
    for d in got:
        assert d.queue == "q"
        assert d.headers["k"] == "v"
        assert d.deliveries == 1 and d.attempts == 0 and d.history == []
        assert before <= d.acquired_at <= now
        assert d.first_attempt_at == d.acquired_at
        assert d.lease_expires_at == d.acquired_at + timedelta(seconds=30)
        assert d.created_at.tzinfo is UTC and d.scheduled_at is not None
        assert d.scheduled_at < before
    # Each delivery has its own headers: a handler changing one changes no other.
    got[0].headers["k"] = "changed"
    assert got[1].headers["k"] == "v"
    for d in got:
        (row,) = await rows(broker, id=d.id)
        assert row["state"] == "PROCESSING" and row["deliveries_count"] == 1
        assert row["next_attempt_at"] is None
        assert row["lease_expires_at"] == d.lease_expires_at
        assert (row["created_at"], row["first_attempt_at"], row["acquired_at"]) == (
            d.created_at, d.first_attempt_at, d.acquired_at)
    assert [d.id for d in await broker.engine.acquire(["q"], 10, 30)] == [ids[0]]
    assert await broker.engine.acquire(["q"], 10, 30) == []


@on_every_engine  # the in-memory engine returns the same
async def test_a_redelivery_carries_its_history_and_a_plain_ack_keeps_it(
    broker: Broker,
) -> None:
    engine = broker.engine
    msg_id = await broker.publish("q", "x", headers={"h": "1"})
    (first,) = await engine.acquire(["q"], 10, 30)
    entry = {"delivery": 1, "ended": "error", "at": "2026-01-01T00:00:00+00:00",
             "error": 'say "no" \\ twice'}
    assert await engine.settle(
        [Settlement(msg_id, 1, Outcome.RETRY, error="e", delay=0.0, history=[entry])]
    ) == {msg_id}

    (again,) = await engine.acquire(["q"], 10, 30)

    assert (again.deliveries, again.attempts, again.history) == (2, 1, [entry])
    assert again.headers == first.headers and again.headers["h"] == "1"
    assert again.created_at == first.created_at
    assert again.first_attempt_at == first.first_attempt_at < again.acquired_at
    assert await engine.settle([Settlement(msg_id, 2, Outcome.COMPLETE)]) == {msg_id}
    (row,) = await rows(broker, "archive")
    assert row["history"] == [entry] and row["attempts_count"] == 2


@on_every_engine  # the in-memory engine returns the same
async def test_settle_reports_what_landed_for_every_outcome(broker: Broker) -> None:
    engine = broker.engine
    ids = await broker.publish_batch("q", ["done", "bad", "again", "back", "stale"])
    got = {d.id: d for d in await engine.acquire(["q"], 10, 30)}
    assert set(got) == set(ids)
    done, bad, again, back, stale = ids
    applied = await engine.settle([
        Settlement(done, 1, Outcome.COMPLETE),
        Settlement(bad, 1, Outcome.FAIL, error="no", history=[{"delivery": 1, "ended": "x"}]),
        Settlement(again, 1, Outcome.RETRY, error="later", delay=60.0),
        Settlement(back, 1, Outcome.RELEASE, refund=True, attempted=False),
        Settlement(stale, 2, Outcome.COMPLETE),
    ])
    assert applied == {done, bad, again, back}
    archive = {r["id"]: r for r in await rows(broker, "archive")}
    assert {i: archive[i]["state"] for i in archive} == {done: "COMPLETED", bad: "FAILED"}
    assert archive[bad]["error"] == "no" and archive[bad]["attempts_count"] == 1
    left = {r["id"]: r for r in await rows(broker)}
    assert set(left) == {again, back, stale}
    assert left[again]["state"] == "RETRYABLE" and left[again]["attempts_count"] == 1
    assert left[back]["state"] == "PENDING" and left[back]["deliveries_count"] == 0
    assert left[stale]["state"] == "PROCESSING"
    # Only releases and retries in a batch: nothing archived, both reported.
    assert await engine.settle([Settlement(stale, 1, Outcome.RELEASE, refund=True,
                                           attempted=False)]) == {stale}


async def test_a_statement_failing_mid_settle_changes_nothing_and_holds_no_lock(
    broker: Broker,
) -> None:
    engine = broker.engine
    first, second = await broker.publish_batch("q", ["one", "two"])
    await engine.acquire(["q"], 10, 30)
    # An archive row already holding ``first``'s id makes the archive insert fail after the
    # rows were locked.
    a = broker.schema.archive
    now = await engine.now()
    async with broker.db.begin() as conn:
        await conn.execute(insert(a).values(
            id=first, queue="q", headers={}, payload=b"x", state="COMPLETED", attempts_count=1,
            deliveries_count=1, created_at=now, archived_at=now,
        ))
    batch = [Settlement(first, 1, Outcome.COMPLETE), Settlement(second, 1, Outcome.COMPLETE)]
    with pytest.raises(DBAPIError):
        await engine.settle(batch)
    assert [r["state"] for r in await rows(broker)] == ["PROCESSING", "PROCESSING"]

    # Nothing is left locked: the same rows settle at once, without waiting for a lock.
    assert await asyncio.wait_for(engine.settle(batch[1:]), 10) == {second}
    assert await asyncio.wait_for(engine.extend([(first, 1)], 30), 10) == {first}
    assert [r["id"] for r in await rows(broker)] == [first]
    third = await broker.publish("q", "three")
    assert [d.id for d in await asyncio.wait_for(engine.acquire(["q"], 10, 30), 10)] == [third]


@pytest.mark.parametrize("db_kind", ["mariadb"])
async def test_mariadb_one_statement_at_a_time_and_a_capped_batch(broker: Broker) -> None:
    """Another driver than asyncmy gets the statements one by one; and one acquire gathers
    no more ids than its session variable may hold."""
    engine = broker.engine
    engine._multi = False  # type: ignore[attr-defined]
    engine._max_batch = 2  # type: ignore[attr-defined]
    ids = await broker.publish_batch("q", ["a", "b", "c"])
    got = await engine.acquire(["q"], 10, 30)
    assert [d.id for d in got] == ids[:2]
    assert await engine.settle([Settlement(ids[0], 1, Outcome.COMPLETE),
                                Settlement(ids[1], 1, Outcome.RETRY, delay=0.0)]) == set(ids[:2])
    assert [d.id for d in await engine.acquire(["q"], 10, 30)] == [ids[2], ids[1]]
    assert [r["id"] for r in await rows(broker, "archive")] == [ids[0]]


@pytest.mark.parametrize("db_kind", ["mariadb"])
async def test_mariadb_batch_cap_follows_group_concat_max_len(broker: Broker) -> None:
    from sqlmq.engines.mysql.engine import _ID_BYTES, _ID_LIST

    async with broker.db.connect() as conn:
        limit = await broker.engine._id_list_limit(conn)  # type: ignore[attr-defined]
        max_len = (await conn.exec_driver_sql("SELECT @@group_concat_max_len")).scalar_one()
    assert limit == min(_ID_LIST, int(max_len)) // _ID_BYTES
    assert limit >= 1000
