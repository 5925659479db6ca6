"""Publishing: ids, content, delays and schedules, the sync twin, the hand-over."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from sqlmq.lifecycle import Outcome
from sqlmq.records import NewMessages, Settlement

from .conftest import HANDING_OVER, Env, ids, msg

SECOND = timedelta(seconds=1)


async def test_publish_returns_increasing_ids_in_publish_order(env: Env) -> None:
    one = await env.publish("q", b"first")
    many = await env.publish("q", b"second", b"third", b"fourth")
    assert len(one) == 1 and len(many) == 3
    assert one + many == sorted(set(one + many))
    taken = await env.engine.acquire(["q"], 10, 30)
    assert ids(taken) == one + many
    assert [d.payload for d in taken] == [b"first", b"second", b"third", b"fourth"]


async def test_acquired_delivery_carries_the_message_and_a_fresh_lease(env: Env) -> None:
    before = await env.engine.now()
    (msg_id,) = await env.publish("q", b"hello", headers={"k": "v"})
    (d,) = await env.engine.acquire(["q"], 10, 30)
    after = await env.engine.now()
    assert (d.id, d.queue, d.payload, d.headers) == (msg_id, "q", b"hello", {"k": "v"})
    assert (d.attempts, d.deliveries, d.history, d.defect) == (0, 1, [], None)
    assert before - SECOND <= d.created_at <= d.acquired_at <= after + SECOND
    assert d.first_attempt_at == d.acquired_at
    assert d.scheduled_at is not None and d.scheduled_at <= d.acquired_at + SECOND / 100
    lease = (d.lease_expires_at - d.acquired_at).total_seconds()
    assert lease == pytest.approx(30, abs=0.01)


async def test_delayed_message_is_not_acquired_before_its_delay(env: Env) -> None:
    (msg_id,) = await env.publish("q", delay=0.3)
    assert (await env.stats()).pending == 1
    came = await env.acquire_early()
    await env.passes(0.35)
    (d,) = came or await env.engine.acquire(["q"], 10, 30)
    assert d.id == msg_id
    assert d.scheduled_at is not None
    waited = (d.scheduled_at - d.created_at).total_seconds()
    assert waited == pytest.approx(0.3, abs=0.01)


async def test_message_published_at_a_time_waits_until_then(env: Env) -> None:
    at = await env.engine.now() + timedelta(seconds=0.3)
    (msg_id,) = await env.publish("q", at=at)
    came = await env.acquire_early()
    await env.passes(0.35)
    (d,) = came or await env.engine.acquire(["q"], 10, 30)
    assert d.id == msg_id
    assert d.scheduled_at is not None and abs(d.scheduled_at - at) < SECOND / 100


async def test_message_published_at_a_past_time_is_ready_first(env: Env) -> None:
    (plain,) = await env.publish("q")
    (early,) = await env.publish("q", at=await env.engine.now() - timedelta(minutes=1))
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [early, plain]


async def test_publish_sync_inserts_at_once(env: Env) -> None:
    published = await asyncio.to_thread(env.engine.publish_sync, NewMessages.of([msg(), msg()]))
    assert published == sorted(published) and len(set(published)) == 2
    assert ids(await env.engine.acquire(["q"], 10, 30)) == published


def test_only_postgresql_does_not_hand_over(env: Env) -> None:
    assert env.engine.hands_over == (env.kind in HANDING_OVER)


@pytest.mark.parametrize("env", HANDING_OVER, indirect=True)
async def test_publish_leased_inserts_the_first_delivery_already_acquired(env: Env) -> None:
    d = await env.engine.publish_leased(msg(payload=b"direct"), 30)
    assert (d.queue, d.payload, d.attempts, d.deliveries, d.history) == ("q", b"direct", 0, 1, [])
    lease = (d.lease_expires_at - d.acquired_at).total_seconds()
    assert lease == pytest.approx(30, abs=0.01)
    stats = await env.stats()
    assert (stats.pending, stats.processing) == (0, 1)
    assert await env.engine.acquire(["q"], 10, 30) == []
    assert await env.engine.settle([Settlement(d.id, 1, Outcome.COMPLETE)]) == {d.id}


def test_commit_counter_exists_where_it_is_cheap(env: Env) -> None:
    """SQLite's data_version and the memory engine's write count; the server databases
    have nothing cheaper than an acquire (PostgreSQL has LISTEN instead)."""
    assert (env.engine.commit_counter() is not None) == (env.kind in ("memory", "sqlite"))


@pytest.mark.parametrize("env", ["memory", "sqlite"], indirect=True)
async def test_commit_counter_moves_when_a_message_is_published(env: Env) -> None:
    counter = env.engine.commit_counter()
    assert counter is not None
    before = counter()
    await env.publish("q")
    assert counter() != before


async def test_publish_sync_from_many_threads_gets_distinct_ids(env: Env) -> None:
    def publish_five(thread: int) -> list[int]:
        return [env.engine.publish_sync(NewMessages.of([msg(payload=f"{thread}-{i}".encode())]))[0]
                for i in range(5)]

    per_thread = await asyncio.gather(*(asyncio.to_thread(publish_five, t) for t in range(4)))
    for published in per_thread:
        assert published == sorted(published)  # each thread sees its own ids increase
    every = [i for published in per_thread for i in published]
    assert len(set(every)) == 20
    taken = await env.engine.acquire(["q"], 100, 30)
    assert sorted(ids(taken)) == sorted(every)
