"""Expiry: a publish stores when its message expires (seconds from the database's now, or a
moment); every delivery carries it; a settle with ``Outcome.EXPIRE`` archives the message
EXPIRED, fenced like any settle; stats count it. Every publish path stores it: one message,
a batch (PostgreSQL's COPY included), the caller's transaction and a hand-over. Deciding
that a delivery came too late is the lifecycle's (``test_decide``); the runtime's part is
``tests/test_expiry.py``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqlmq.engines.memory.engine import MemoryEngine
from sqlmq.lifecycle import Outcome, State
from sqlmq.records import NewMessage, NewMessages, Settlement

from .conftest import HANDING_OVER, Env, ids

#: A moment to expire at, with microseconds, which every database keeps.
MOMENT = datetime(2031, 5, 17, 8, 30, 15, 123456, tzinfo=UTC)


def emsg(payload: bytes = b"m", *, expires_in: float | None = None,
         expires_at: datetime | None = None, delay: float = 0.0) -> NewMessage:
    return NewMessage("q", payload, {}, delay, None, 0, expires_in, expires_at)


async def publish(env: Env, *payloads: bytes, expires_in: float | None = None,
                  expires_at: datetime | None = None) -> list[int]:
    return await env.engine.publish(NewMessages.of(
        [emsg(p, expires_in=expires_in, expires_at=expires_at) for p in payloads or [b"m"]]))


def close_to(got: datetime | None, want: datetime) -> bool:
    """Within a millisecond: ``now + seconds`` goes through each database's interval
    arithmetic (a float of seconds on PostgreSQL, whole microseconds on MariaDB)."""
    return got is not None and abs((got - want).total_seconds()) < 0.001


async def archived(env: Env, msg_id: int) -> tuple[str, str | None]:
    """``(state, error)`` of ``msg_id``'s archive row."""
    if isinstance(env.engine, MemoryEngine):
        row = env.engine._store.archive[msg_id]
        return row.state, row.error
    a = env.engine.schema.archive
    async with env.outbox_db.connect() as conn:
        row = (await conn.execute(select(a.c.state, a.c.error).where(a.c.id == msg_id))).one()
    return row.state, row.error


async def test_a_message_without_expiry_never_expires(env: Env) -> None:
    await publish(env)
    (d,) = await env.engine.acquire(["q"], 1, 30)
    assert d.expires_at is None


async def test_expiry_in_seconds_counts_from_the_publish_on_the_database_clock(env: Env) -> None:
    await publish(env, b"a", expires_in=90.5)
    (d,) = await env.engine.acquire(["q"], 1, 30)
    assert close_to(d.expires_at, d.created_at + timedelta(seconds=90.5))


async def test_expiry_at_a_moment_is_stored_to_the_microsecond(env: Env) -> None:
    await publish(env, expires_at=MOMENT.astimezone(timezone_plus_five()))
    (d,) = await env.engine.acquire(["q"], 1, 30)
    assert d.expires_at == MOMENT and d.expires_at.tzinfo is not None


def timezone_plus_five() -> timezone:
    return timezone(timedelta(hours=5))


@pytest.mark.parametrize("count", [3, 250])  # 250: PostgreSQL's COPY path (PG_COPY_MIN)
@pytest.mark.parametrize("kind", ["seconds", "moment"])
async def test_a_batch_shares_its_expiry(env: Env, count: int, kind: str) -> None:
    payloads = [b"%d" % i for i in range(count)]
    if kind == "seconds":
        batch = await publish(env, *payloads, expires_in=3600)
    else:
        batch = await publish(env, *payloads, expires_at=MOMENT)
    taken = await env.engine.acquire(["q"], count, 30)
    assert ids(taken) == batch
    for d in taken:
        want = d.created_at + timedelta(hours=1) if kind == "seconds" else MOMENT
        assert close_to(d.expires_at, want)


async def test_outbox_publishes_store_the_expiry(env: Env) -> None:
    async with env.outbox_db.begin() as conn:
        on_connection = await env.engine.publish(
            NewMessages.of([emsg(expires_at=MOMENT), emsg(expires_at=MOMENT)]), conn)
    async with AsyncSession(env.outbox_db) as session:
        on_session = await env.engine.publish(NewMessages.of([emsg(expires_in=60)]), session)
        await session.commit()
    with env.outbox_sync_db.begin() as conn:
        sync = env.engine.publish_sync(NewMessages.of([emsg(expires_at=MOMENT)]), conn)
    with Session(env.outbox_sync_db) as sync_session:
        sync_on_session = env.engine.publish_sync(NewMessages.of([emsg(expires_in=120)]),
                                                  sync_session)
        sync_session.commit()
    taken = {d.id: d for d in await env.engine.acquire(["q"], 10, 30)}
    assert set(taken) == {*on_connection, *on_session, *sync, *sync_on_session}
    for msg_id in (*on_connection, *sync):
        assert taken[msg_id].expires_at == MOMENT
    for msg_id, seconds in ((on_session[0], 60), (sync_on_session[0], 120)):
        d = taken[msg_id]
        assert close_to(d.expires_at, d.created_at + timedelta(seconds=seconds))


@pytest.mark.parametrize("env", HANDING_OVER, indirect=True)
async def test_a_handed_over_publish_carries_and_stores_its_expiry(env: Env) -> None:
    d = await env.engine.publish_leased(emsg(b"direct", expires_in=45), 30)
    assert close_to(d.expires_at, d.created_at + timedelta(seconds=45))
    released = Settlement(d.id, 1, Outcome.RELEASE, refund=True, attempted=False)
    assert await env.engine.settle([released]) == {d.id}
    (again,) = await env.engine.acquire(["q"], 1, 30)
    assert close_to(again.expires_at, d.created_at + timedelta(seconds=45))
    moment = await env.engine.publish_leased(emsg(b"at", expires_at=MOMENT), 30)
    assert moment.expires_at == MOMENT


async def test_an_expire_settlement_archives_the_message_expired(env: Env) -> None:
    expired, kept = await publish(env, b"old", b"young", expires_in=0.05)
    await env.passes(0.1)
    d1, d2 = await env.engine.acquire(["q"], 2, 30)
    assert d1.acquired_at >= d1.expires_at  # type: ignore[operator]
    settle = Settlement(expired, d1.deliveries, Outcome.EXPIRE, error="expired",
                        attempted=False)
    assert await env.engine.settle([settle]) == {expired}
    assert await archived(env, expired) == (State.EXPIRED, "expired")
    assert await env.engine.landed([settle]) == {expired}
    stale = Settlement(kept, d2.deliveries - 1, Outcome.EXPIRE, attempted=False)
    assert await env.engine.settle([stale]) == set()  # fenced like every settle
    stats = await env.stats()
    assert (stats.expired, stats.processing, stats.completed, stats.failed) == (1, 1, 0, 0)


async def test_requeued_from_the_archive_a_message_no_longer_expires(env: Env) -> None:
    """Requeue makes a fresh message of an archived one: it keeps no expiry, or a message
    requeued after its moment would only expire again."""
    (msg_id,) = await publish(env, expires_at=MOMENT)
    (d,) = await env.engine.acquire(["q"], 1, 30)
    await env.engine.settle([Settlement(msg_id, d.deliveries, Outcome.FAIL, error="x")])
    assert await env.engine.requeue_archived(queue="q") == 1
    (again,) = await env.engine.acquire(["q"], 1, 30)
    assert (again.id, again.expires_at) == (msg_id, None)
