"""Priority: among ready messages the highest priority is taken first, FIFO (ready time, then
id) within a priority; a delayed message waits for its time whatever its priority; retry,
release, requeue and the archive keep a message's priority; every publish path carries it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqlmq.engines.memory.engine import MemoryEngine
from sqlmq.lifecycle import Outcome
from sqlmq.records import NewMessage, NewMessages, Settlement

from .conftest import HANDING_OVER, Env, ids


def pmsg(priority: int, payload: bytes = b"m", queue: str = "q", *,
         delay: float = 0.0) -> NewMessage:
    return NewMessage(queue, payload, {}, delay, None, priority)


async def publish(env: Env, priority: int, *payloads: bytes, queue: str = "q",
                  delay: float = 0.0) -> list[int]:
    """One ``engine.publish`` (a batch sharing its priority, as ``publish_batch`` sends)."""
    return await env.engine.publish(
        NewMessages.of([pmsg(priority, p, queue, delay=delay) for p in payloads or [b"m"]]))


async def archived_priority(env: Env, msg_id: int) -> int:
    """The priority column of ``msg_id``'s archive row."""
    if isinstance(env.engine, MemoryEngine):
        return env.engine._store.archive[msg_id].priority
    a = env.engine.schema.archive
    async with env.outbox_db.connect() as conn:  # sqlmq's own database on a SQL engine
        return (await conn.execute(select(a.c.priority).where(a.c.id == msg_id))).scalar_one()


async def test_the_highest_priority_is_taken_first(env: Env) -> None:
    low = await publish(env, 0, b"l1", b"l2")
    high = await publish(env, 9, b"h1", b"h2")
    mid = await publish(env, 5, b"m1")
    negative = await publish(env, -3, b"n1")
    taken = await env.engine.acquire(["q"], 10, 30)
    assert ids(taken) == high + mid + low + negative
    assert [d.priority for d in taken] == [9, 9, 5, 0, 0, -3]


async def test_acquire_limit_takes_the_highest_priorities(env: Env) -> None:
    low = await publish(env, 1, b"a", b"b", b"c")
    high = await publish(env, 2, b"d", b"e")
    assert ids(await env.engine.acquire(["q"], 3, 30)) == [*high, low[0]]
    assert ids(await env.engine.acquire(["q"], 3, 30)) == low[1:]


async def test_within_a_priority_messages_go_by_ready_time_then_id(env: Env) -> None:
    (later,) = await publish(env, 4, b"later", delay=0.2)
    first, second = await publish(env, 4, b"first", b"second")
    early = await env.engine.publish(
        NewMessages.of([NewMessage("q", b"early", {}, 0.0,
                                   await env.engine.now() - timedelta(seconds=10), 4)]))
    (other,) = await publish(env, 3, b"lower")
    await env.passes(0.25)
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [*early, first, second, later, other]


async def test_a_delayed_high_priority_message_waits_for_its_time(env: Env) -> None:
    (urgent_later,) = await publish(env, 100, b"later", delay=0.3)
    (ready,) = await publish(env, 0, b"now")
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [ready]
    came = await env.acquire_early()
    await env.passes(0.35)
    (d,) = came or await env.engine.acquire(["q"], 10, 30)
    assert (d.id, d.priority) == (urgent_later, 100)


async def test_priority_orders_across_the_queues_of_one_acquire(env: Env) -> None:
    (a_low,) = await publish(env, 0, queue="a")
    (b_high,) = await publish(env, 7, queue="b")
    (c_top,) = await publish(env, 99, queue="c")
    (a_high,) = await publish(env, 7, queue="a")
    taken = await env.engine.acquire(["a", "b"], 10, 30)
    assert ids(taken) == [b_high, a_high, a_low]
    assert ids(await env.engine.acquire(["c"], 10, 30)) == [c_top]


async def test_retry_keeps_the_priority(env: Env) -> None:
    (msg_id,) = await publish(env, 8)
    (d,) = await env.engine.acquire(["q"], 1, 30)
    assert await env.engine.settle([Settlement(d.id, 1, Outcome.RETRY, delay=0.0)]) == {msg_id}
    (low,) = await publish(env, 0)
    taken = await env.engine.acquire(["q"], 10, 30)
    assert ids(taken) == [msg_id, low]
    assert (taken[0].priority, taken[0].deliveries) == (8, 2)


async def test_release_and_recovery_keep_the_priority(env: Env) -> None:
    (msg_id,) = await publish(env, 6)
    (d,) = await env.engine.acquire(["q"], 1, 30)
    released = Settlement(d.id, 1, Outcome.RELEASE, refund=True, attempted=False)
    assert await env.engine.settle([released]) == {msg_id}
    (d,) = await env.engine.acquire(["q"], 1, 0.1)
    assert d.priority == 6
    await env.passes(0.15)
    assert await env.engine.recover_expired(10) == [msg_id]
    (low,) = await publish(env, 0)
    taken = await env.engine.acquire(["q"], 10, 30)
    assert ids(taken) == [msg_id, low] and taken[0].priority == 6


async def test_the_archive_shows_the_priority_and_requeue_keeps_it(env: Env) -> None:
    failed, completed = await publish(env, -7, b"fail", b"done")
    (d1, d2) = await env.engine.acquire(["q"], 2, 30)
    assert await env.engine.settle([Settlement(d1.id, 1, Outcome.FAIL, error="boom"),
                                    Settlement(d2.id, 1, Outcome.COMPLETE)]) == {failed,
                                                                                 completed}
    assert await archived_priority(env, failed) == -7
    assert await archived_priority(env, completed) == -7
    (plain,) = await publish(env, 0)
    assert await env.engine.requeue_archived(queue="q") == 1
    taken = await env.engine.acquire(["q"], 10, 30)
    assert ids(taken) == [plain, failed]
    assert [d.priority for d in taken] == [0, -7]


@pytest.mark.parametrize("count", [3, 250])  # 250: PostgreSQL's COPY path (PG_COPY_MIN)
async def test_a_batch_carries_its_priority(env: Env, count: int) -> None:
    low = await publish(env, 0, b"low")
    batch = await publish(env, 3, *[b"%d" % i for i in range(count)])
    taken = await env.engine.acquire(["q"], count + 1, 30)
    assert ids(taken) == batch + low
    assert {d.priority for d in taken[:count]} == {3}


async def test_outbox_publishes_carry_the_priority(env: Env) -> None:
    (low,) = await publish(env, 0)
    async with env.outbox_db.begin() as conn:
        on_connection = await env.engine.publish(NewMessages.of([pmsg(2), pmsg(2)]), conn)
    async with AsyncSession(env.outbox_db) as session:
        on_session = await env.engine.publish(NewMessages.of([pmsg(4)]), session)
        await session.commit()
    with env.outbox_sync_db.begin() as conn:
        sync = env.engine.publish_sync(NewMessages.of([pmsg(3)]), conn)
    with Session(env.outbox_sync_db) as sync_session:
        sync_on_session = env.engine.publish_sync(NewMessages.of([pmsg(5)]), sync_session)
        sync_session.commit()
    taken = await env.engine.acquire(["q"], 10, 30)
    assert ids(taken) == [*sync_on_session, *on_session, *sync, *on_connection, low]
    assert [d.priority for d in taken] == [5, 4, 3, 2, 2, 0]


@pytest.mark.parametrize("env", HANDING_OVER, indirect=True)
async def test_a_handed_over_publish_keeps_its_priority(env: Env) -> None:
    d = await env.engine.publish_leased(pmsg(12, b"direct"), 30)
    assert d.priority == 12
    released = Settlement(d.id, 1, Outcome.RELEASE, refund=True, attempted=False)
    assert await env.engine.settle([released]) == {d.id}
    (low,) = await publish(env, 0)
    taken = await env.engine.acquire(["q"], 10, 30)
    assert ids(taken) == [d.id, low] and taken[0].priority == 12
