"""Defer and cancellation through the engine contract, on every engine: a defer saves state
and counts as neither an attempt nor a delivery against max_deliveries, fenced like every
settle; cancel archives a waiting message, flags a running one, and tells an archived or
unknown id apart."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sqlmq.codec import decode_state, encode_state
from sqlmq.lifecycle import Outcome, State
from sqlmq.records import Delivery, Settlement

from .conftest import Env


def defer(d: Delivery, delay: float = 0.0, state: object = None, **kw: Any) -> Settlement:
    entry = {"delivery": d.deliveries, "ended": "deferred"}
    return Settlement(d.id, d.deliveries, Outcome.DEFER, delay=delay, attempted=False,
                      history=[*d.history, entry],
                      saved_state=None if state is None else encode_state(state), **kw)


async def test_a_defer_saves_state_and_counts_no_attempt(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert (d.saved_state, d.defers, d.cancel_requested) == (None, 0, False)
    first = defer(d, 0.3, {"page": 7, "seen": ["a"]})
    assert await env.engine.settle([first]) == {msg_id}
    assert await env.engine.landed([first]) == {msg_id}
    stats = await env.stats()
    assert (stats.pending, stats.processing, stats.retryable) == (1, 0, 0)
    came = await env.acquire_early()
    await env.passes(0.35)
    (again,) = came or await env.engine.acquire(["q"], 10, 30)
    assert decode_state(again.saved_state) == {"page": 7, "seen": ["a"]}
    assert (again.defers, again.attempts, again.deliveries) == (1, 0, 2)
    last = dict(again.history[-1])
    assert last.pop("at")  # the defer's time, added by the engine
    assert last == {"delivery": 1, "ended": "deferred"}
    assert await env.engine.settle([defer(again, 0.0, b"\x00raw")]) == {msg_id}
    (third,) = await env.engine.acquire(["q"], 10, 30)
    assert (decode_state(third.saved_state), third.defers) == (b"\x00raw", 2)
    assert await env.engine.settle([Settlement(msg_id, 3, Outcome.COMPLETE)]) == {msg_id}
    assert (await env.stats()).completed == 1


async def test_a_defer_until_a_moment_waits_for_it(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    at = await env.engine.now() + timedelta(seconds=0.4)
    assert await env.engine.settle([defer(d, at=at)]) == {msg_id}
    stats = await env.stats()
    assert stats.oldest_ready_at == at
    await env.passes(0.45)
    assert [x.id for x in await env.engine.acquire(["q"], 10, 30)] == [msg_id]


async def test_a_stale_defer_is_dropped(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 0.2)
    await env.passes(0.25)
    assert await env.engine.recover_expired(10) == [msg_id]
    (now_held,) = await env.engine.acquire(["q"], 10, 30)
    stale = defer(d, 0.0, "old")
    assert await env.engine.settle([stale]) == set()
    assert await env.engine.landed([stale]) == set()
    assert (await env.stats()).processing == 1  # the new delivery still holds it
    assert await env.engine.settle([defer(now_held, 0.0, "new")]) == {msg_id}
    (third,) = await env.engine.acquire(["q"], 10, 30)
    assert decode_state(third.saved_state) == "new"


async def test_a_defer_mixed_with_other_results_in_one_batch(env: Env) -> None:
    a, b, c = await env.publish("q", b"a", b"b", b"c")
    _da, db, _dc = await env.engine.acquire(["q"], 10, 30)
    batch = [Settlement(a, 1, Outcome.COMPLETE), defer(db, 0.0, [1]),
             Settlement(c, 1, Outcome.RETRY, error="boom", delay=0.0)]
    assert await env.engine.settle(batch) == {a, b, c}
    assert await env.engine.landed(batch) == {a, b, c}
    stats = await env.stats()
    assert (stats.completed, stats.pending, stats.retryable) == (1, 1, 1)


async def test_cancel_of_a_waiting_message_archives_it(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (later,) = await env.publish("q", delay=60)
    done = await env.engine.cancel(msg_id)
    assert (done.outcome, done.state) == ("cancelled", State.CANCELLED)
    assert (await env.engine.cancel(later)).outcome == "cancelled"
    assert await env.engine.acquire(["q"], 10, 30) == []
    stats = await env.stats()
    assert (stats.pending, stats.cancelled) == (0, 2)
    again = await env.engine.cancel(msg_id)
    assert (again.outcome, again.state) == ("archived", State.CANCELLED)
    assert "already ended as CANCELLED" in str(again)
    # the archive keeps it like any other ending: it can be requeued
    assert await env.engine.requeue_archived(ids=[msg_id], state=State.CANCELLED) == 1
    assert [d.id for d in await env.engine.acquire(["q"], 10, 30)] == [msg_id]


async def test_cancel_of_unknown_and_finished_messages_changes_nothing(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    await env.engine.settle([Settlement(d.id, 1, Outcome.COMPLETE)])
    done = await env.engine.cancel(msg_id)
    assert (done.outcome, done.state) == ("archived", State.COMPLETED)
    missing = await env.engine.cancel(msg_id + 1000)
    assert (missing.outcome, missing.state) == ("unknown", None)
    assert str(missing) == f"no message {msg_id + 1000} (not waiting, running or archived)"
    assert (await env.stats()).completed == 1


async def test_cancel_of_a_running_message_flags_it(env: Env) -> None:
    a, b = await env.publish("q", b"a", b"b")
    _da, _db = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.cancel_requests([a, b]) == set()
    found = await env.engine.cancel(a)
    assert (found.outcome, found.state) == ("requested", State.PROCESSING)
    assert await env.engine.cancel_requests([a, b]) == {a}
    # a success still completes it
    assert await env.engine.settle([Settlement(a, 1, Outcome.COMPLETE)]) == {a}
    await env.engine.cancel(b)
    cancel = Settlement(b, 1, Outcome.CANCEL, error="cancelled", attempted=False)
    assert await env.engine.settle([cancel]) == {b}
    assert await env.engine.landed([cancel]) == {b}
    stats = await env.stats()
    assert (stats.processing, stats.completed, stats.cancelled) == (0, 1, 1)


async def test_a_flagged_message_sent_back_is_acquired_flagged(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (_d,) = await env.engine.acquire(["q"], 10, 30)
    await env.engine.cancel(msg_id)
    retry = Settlement(msg_id, 1, Outcome.RETRY, error="boom", delay=0.0)
    assert await env.engine.settle([retry]) == {msg_id}
    (again,) = await env.engine.acquire(["q"], 10, 30)
    assert again.cancel_requested  # the runtime archives it CANCELLED without running it


@pytest.mark.parametrize("state", [None, "kept"])
async def test_a_defer_after_a_cancel_archives_it_cancelled(env: Env, state: str | None) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    await env.engine.cancel(msg_id)
    late = defer(d, 0.0, state)
    assert await env.engine.settle([late]) == {msg_id}
    assert await env.engine.landed([late]) == {msg_id}
    stats = await env.stats()
    assert (stats.pending, stats.cancelled) == (0, 1)
