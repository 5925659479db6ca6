"""Acquire: ready order (ready time, then id), delays, limits, queues, leases held."""

from __future__ import annotations

from datetime import timedelta

from .conftest import Env, ids


async def test_acquire_takes_messages_by_ready_time_not_by_id(env: Env) -> None:
    # Ready times from one reading of the clock: with delay=0.2 and a plain publish after
    # it, a loaded CI took over 0.2 s between the two and the order flipped.
    start = await env.engine.now()
    (later,) = await env.publish("q", at=start + timedelta(seconds=0.2))
    (now,) = await env.publish("q", at=start)
    (earliest,) = await env.publish("q", at=start - timedelta(seconds=10))
    await env.passes(0.25)
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [earliest, now, later]


async def test_messages_ready_together_are_taken_in_id_order(env: Env) -> None:
    published = await env.publish("q", b"a", b"b", b"c", b"d", b"e")
    taken = ids(await env.engine.acquire(["q"], 2, 30))
    taken += ids(await env.engine.acquire(["q"], 2, 30))
    taken += ids(await env.engine.acquire(["q"], 2, 30))
    assert taken == published


async def test_acquire_takes_at_most_limit(env: Env) -> None:
    published = await env.publish("q", b"1", b"2", b"3", b"4", b"5")
    assert ids(await env.engine.acquire(["q"], 2, 30)) == published[:2]
    assert ids(await env.engine.acquire(["q"], 10, 30)) == published[2:]
    assert await env.engine.acquire(["q"], 10, 30) == []


async def test_acquire_reads_only_its_queues_in_ready_order_across_them(env: Env) -> None:
    (a1,) = await env.publish("a")
    (b1,) = await env.publish("b")
    (c1,) = await env.publish("c")
    (a2,) = await env.publish("a")
    (b2,) = await env.publish("b")
    taken = await env.engine.acquire(["a", "b"], 10, 30)
    assert ids(taken) == [a1, b1, a2, b2]
    assert [d.queue for d in taken] == ["a", "b", "a", "b"]
    assert (await env.stats("c")).pending == 1
    assert ids(await env.engine.acquire(["c"], 10, 30)) == [c1]


async def test_leased_message_is_not_acquired_again(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [msg_id]
    assert await env.engine.acquire(["q"], 10, 30) == []
    stats = await env.stats()
    assert (stats.pending, stats.processing) == (0, 1)


async def test_acquire_on_an_empty_queue_takes_nothing(env: Env) -> None:
    await env.publish("other")
    assert await env.engine.acquire(["q"], 10, 30) == []
