"""Deduplication keys: while a message with a key waits or runs in its queue, a publish
with that key writes nothing and returns that message's id as a duplicate; once it is
archived the key is free. Every publish path keeps the rule: one message, a batch (keys
repeated within it, mixed with unkeyed messages), the caller's transaction, sync and async.
Publishers in several processes: ``tests/test_dedup.py``."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqlmq.engines.memory.engine import MemoryEngine
from sqlmq.lifecycle import Outcome
from sqlmq.records import NewMessage, NewMessages, Published, Settlement

from .conftest import Env, ids


def kmsg(key: str | None, payload: bytes = b"m", queue: str = "q") -> NewMessage:
    return NewMessage(queue, payload, {}, dedup_key=key)


async def publish(env: Env, *keys: str | None, queue: str = "q", executor: object = None,
                  ) -> list[int]:
    return await env.engine.publish(
        NewMessages.of([kmsg(k, f"p{i}".encode(), queue) for i, k in enumerate(keys)]),
        executor)  # type: ignore[arg-type]


def flags(published: list[int]) -> list[bool | None]:
    """Each id's ``duplicate`` (None: an unkeyed message's plain id)."""
    return [p.duplicate if isinstance(p, Published) else None for p in published]


async def test_a_second_publish_with_the_key_returns_the_first_and_writes_nothing(
    env: Env,
) -> None:
    (first,) = await publish(env, "charge-7f3a")
    (again,) = await publish(env, "charge-7f3a")
    assert isinstance(first, Published) and first.duplicate is False
    assert isinstance(again, Published) and again.duplicate is True
    assert again == first
    assert (await env.stats()).pending == 1
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert d.id == first and d.payload == b"p0"  # the first publish's body, not the second


async def test_keys_are_per_queue_and_exact(env: Env) -> None:
    (a,) = await publish(env, "k")
    (b,) = await publish(env, "k", queue="other")
    (c,) = await publish(env, "K")
    (d,) = await publish(env, "k ")
    assert len({a, b, c, d}) == 4 and flags([a, b, c, d]) == [False] * 4


async def test_the_key_is_held_while_running_and_waiting_to_retry(env: Env) -> None:
    (first,) = await publish(env, "k")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    (running,) = await publish(env, "k")
    assert (running, running.duplicate) == (first, True)  # type: ignore[attr-defined]
    await env.engine.settle([Settlement(d.id, d.deliveries, Outcome.RETRY, delay=30)])
    (retrying,) = await publish(env, "k")
    assert (retrying, retrying.duplicate) == (first, True)  # type: ignore[attr-defined]
    assert (await env.stats()).retryable == 1


@pytest.mark.parametrize("outcome", [Outcome.COMPLETE, Outcome.FAIL, Outcome.EXPIRE])
async def test_an_archived_message_frees_its_key(env: Env, outcome: Outcome) -> None:
    (first,) = await publish(env, "k")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    await env.engine.settle([Settlement(d.id, d.deliveries, outcome)])
    (second,) = await publish(env, "k")
    assert second != first and second.duplicate is False  # type: ignore[attr-defined]
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [second]


async def test_a_requeued_message_comes_back_without_its_key(env: Env) -> None:
    (first,) = await publish(env, "k")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    await env.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL)])
    assert await env.engine.requeue_archived(queue="q") == 1
    (second,) = await publish(env, "k")
    assert second != first and second.duplicate is False  # type: ignore[attr-defined]
    assert sorted(ids(await env.engine.acquire(["q"], 10, 30))) == sorted([first, second])


async def test_a_batch_with_repeated_and_missing_keys(env: Env) -> None:
    (held,) = await publish(env, "b")
    got = await publish(env, "a", None, "b", "a", None, "c")
    assert flags(got) == [False, None, True, True, None, False]
    assert got[2] == held and got[3] == got[0]
    new = [got[i] for i in (0, 1, 4, 5)]
    assert len(set(new)) == 4 and held not in new
    assert got[1] < got[4]  # unkeyed messages keep their order
    taken = await env.engine.acquire(["q"], 10, 30)
    assert sorted(ids(taken)) == sorted([held, *new])
    assert {d.id: d.payload for d in taken}[got[0]] == b"p0"


async def test_a_large_batch_of_keys_half_taken(env: Env) -> None:
    keys = [f"k{i}" for i in range(2500)]
    before = await publish(env, *keys[::2])
    got = await publish(env, *keys)
    assert flags(got) == [i % 2 == 0 for i in range(2500)]
    assert got[::2] == before
    assert (await env.stats()).pending == 2500


async def test_an_outbox_publish_holds_the_key_once_committed(env: Env) -> None:
    async with env.outbox_db.begin() as conn:
        (first,) = await publish(env, "k", executor=conn)
        assert first.duplicate is False  # type: ignore[attr-defined]
    (again,) = await publish(env, "k")
    assert (again, again.duplicate) == (first, True)  # type: ignore[attr-defined]


async def test_an_outbox_publish_rolled_back_leaves_the_key_free(env: Env) -> None:
    async with env.outbox_db.connect() as conn:
        await conn.begin()
        await publish(env, "k", executor=conn)
        await conn.rollback()
    (kept,) = await publish(env, "k")
    assert kept.duplicate is False  # type: ignore[attr-defined]
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [kept]


async def test_a_session_and_the_sync_paths_dedup_too(env: Env) -> None:
    async with AsyncSession(env.outbox_db) as session:
        (first,) = await publish(env, "k", executor=session)
        await session.commit()
    with env.outbox_sync_db.begin() as conn:
        got = env.engine.publish_sync(NewMessages.of([kmsg("k"), kmsg("j")]), conn)
    assert flags(got) == [True, False] and got[0] == first
    with Session(env.outbox_sync_db) as session:
        (again,) = env.engine.publish_sync(NewMessages.of([kmsg("j")]), session)
        session.commit()
    assert (again, again.duplicate) == (got[1], True)  # type: ignore[attr-defined]
    if not isinstance(env.engine, MemoryEngine):  # the memory engine has no own sync path
        (own,) = env.engine.publish_sync(NewMessages.of([kmsg("j")]))
        assert (own, own.duplicate) == (got[1], True)  # type: ignore[attr-defined]
    assert (await env.stats()).pending == 2


async def test_a_second_transaction_waits_for_the_first_to_decide(env: Env) -> None:
    """Two transactions publish one key: the second is a duplicate if the first commits
    and inserts if it rolls back. The databases make the second wait for the first (SQLite
    for its write lock, the others on the row)."""
    if isinstance(env.engine, MemoryEngine):
        return await _memory_answers_from_the_reservation(env)
    for commit in (True, False):
        key = f"k-{commit}"
        async with env.outbox_db.connect() as first:
            await first.begin()
            (held,) = await publish(env, key, executor=first)
            second = asyncio.create_task(publish(env, key))
            await asyncio.sleep(0.3)
            assert not second.done()  # waiting on the first transaction
            await (first.commit() if commit else first.rollback())
            (got,) = await asyncio.wait_for(second, 10)
        assert got.duplicate is commit  # type: ignore[attr-defined]
        if commit:
            assert got == held
    # the rolled-back publish left nothing (SQLite may even give its id again)
    assert (await env.stats()).pending == 2


async def _memory_answers_from_the_reservation(env: Env) -> None:
    """The memory engine cannot wait for the first transaction (its publish_sync may run on
    the thread that holds it): the key is reserved at publish, so the second publish is at
    once a duplicate of the first, and after the first rolls back the key is free again.
    Documented in docs/routing.md."""
    async with env.outbox_db.connect() as first:
        await first.begin()
        (held,) = await publish(env, "k", executor=first)
        (second,) = await publish(env, "k")
        assert (second, second.duplicate) == (held, True)  # type: ignore[attr-defined]
        await first.rollback()
    (third,) = await publish(env, "k")
    assert third.duplicate is False and third != held  # type: ignore[attr-defined]
