"""Settle: each outcome, as the lifecycle chart draws it (docs/lifecycle.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sqlmq.lifecycle import Outcome
from sqlmq.records import Settlement

from .conftest import Env, ids


async def test_complete_archives_the_message(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    done = Settlement(d.id, 1, Outcome.COMPLETE)
    assert await env.engine.settle([done]) == {msg_id}
    stats = await env.stats()
    assert (stats.pending, stats.processing, stats.completed, stats.failed) == (0, 0, 1, 0)
    assert stats.oldest_ready_at is None
    assert await env.engine.landed([done]) == {msg_id}
    assert await env.engine.acquire(["q"], 10, 30) == []


async def test_fail_archives_the_message_as_failed(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    failed = Settlement(d.id, 1, Outcome.FAIL, error="Traceback: boom")
    assert await env.engine.settle([failed]) == {msg_id}
    stats = await env.stats()
    assert (stats.processing, stats.completed, stats.failed) == (0, 0, 1)
    assert await env.engine.landed([failed]) == {msg_id}


async def test_retry_makes_the_message_retryable_until_its_delay_passes(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    now = await env.engine.now()
    retry = Settlement(d.id, 1, Outcome.RETRY, error="boom", delay=0.3)
    assert await env.engine.settle([retry]) == {msg_id}
    stats = await env.stats()
    assert (stats.pending, stats.processing, stats.retryable) == (0, 0, 1)
    assert stats.oldest_ready_at is not None
    ready_in = (stats.oldest_ready_at - now).total_seconds()
    assert ready_in == pytest.approx(0.3, abs=0.2)
    came = await env.acquire_early()
    await env.passes(0.35)
    (again,) = came or await env.engine.acquire(["q"], 10, 30)
    assert (again.id, again.attempts, again.deliveries) == (msg_id, 1, 2)
    assert again.first_attempt_at == d.first_attempt_at or (
        again.first_attempt_at is not None and d.first_attempt_at is not None
        and abs(again.first_attempt_at - d.first_attempt_at) < timedelta(milliseconds=2))
    assert await env.engine.landed([retry]) == set()  # delivery 2 holds it now


async def test_retry_counts_an_attempt_only_when_the_handler_ran(env: Env) -> None:
    await env.publish("q", b"ran", b"did-not-run")
    ran, unrun = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([
        Settlement(ran.id, 1, Outcome.RETRY),
        Settlement(unrun.id, 1, Outcome.RETRY, attempted=False),
    ]) == {ran.id, unrun.id}
    again = {d.id: d for d in await env.engine.acquire(["q"], 10, 30)}
    assert (again[ran.id].attempts, again[ran.id].deliveries) == (1, 2)
    assert (again[unrun.id].attempts, again[unrun.id].deliveries) == (0, 2)


async def test_settle_writes_the_new_history_and_otherwise_keeps_the_old(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    history = [{"delivery": 1, "ended": "error", "at": "2026-01-01T00:00:00+00:00",
                "error": "ValueError: boom"}]
    assert await env.engine.settle([Settlement(d.id, 1, Outcome.RETRY, history=history)]) == {
        msg_id}
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert d.history == history
    assert await env.engine.settle([Settlement(d.id, 2, Outcome.RETRY)]) == {msg_id}
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert d.history == history


async def test_release_with_refund_gives_the_delivery_back(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (first,) = await env.engine.acquire(["q"], 10, 30)
    unstarted = Settlement(first.id, 1, Outcome.RELEASE, refund=True, attempted=False)
    assert await env.engine.settle([unstarted]) == {msg_id}
    stats = await env.stats()
    assert (stats.pending, stats.processing, stats.retryable) == (1, 0, 0)
    assert await env.engine.landed([unstarted]) == {msg_id}
    await env.passes(0.05)
    (again,) = await env.engine.acquire(["q"], 10, 30)
    assert (again.id, again.deliveries, again.attempts) == (msg_id, 1, 0)
    # a refunded first delivery leaves no times behind: as if never fetched
    assert again.first_attempt_at is not None and first.first_attempt_at is not None
    assert again.first_attempt_at > first.first_attempt_at


async def test_refund_of_a_later_delivery_keeps_the_first_attempt(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (first,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([Settlement(msg_id, 1, Outcome.RETRY)]) == {msg_id}
    (second,) = await env.engine.acquire(["q"], 10, 30)
    assert (second.deliveries, second.attempts) == (2, 1)
    refund = Settlement(msg_id, 2, Outcome.RELEASE, refund=True, attempted=False)
    assert await env.engine.settle([refund]) == {msg_id}
    await env.passes(0.05)
    (third,) = await env.engine.acquire(["q"], 10, 30)
    assert (third.deliveries, third.attempts) == (2, 1)
    assert third.first_attempt_at is not None and first.first_attempt_at is not None
    assert abs(third.first_attempt_at - first.first_attempt_at) < timedelta(milliseconds=2)


async def test_release_without_refund_keeps_the_delivery_count(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (first,) = await env.engine.acquire(["q"], 10, 30)
    released = Settlement(first.id, 1, Outcome.RELEASE, attempted=False, delay=0.0)
    assert await env.engine.settle([released]) == {msg_id}
    assert (await env.stats()).pending == 1
    assert await env.engine.landed([released]) == {msg_id}
    (again,) = await env.engine.acquire(["q"], 10, 30)
    assert (again.deliveries, again.attempts) == (2, 0)


async def test_release_with_a_delay_waits_for_it(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([Settlement(d.id, 1, Outcome.RELEASE, delay=0.3)]) == {msg_id}
    came = await env.acquire_early()
    await env.passes(0.35)
    assert ids(came or await env.engine.acquire(["q"], 10, 30)) == [msg_id]
