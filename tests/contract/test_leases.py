"""Leases: extension, expiry, and recovery of expired leases."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from sqlmq.lifecycle import Outcome
from sqlmq.records import HISTORY_LIMIT, Settlement

from .conftest import Env, ids


async def test_extended_lease_is_not_recovered(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 0.2)
    before = await env.engine.now()
    assert await env.engine.extend([(d.id, d.deliveries)], 30) == {msg_id}
    await env.passes(0.3)
    assert await env.engine.recover_expired(10) == []
    assert (await env.stats()).processing == 1
    # the extension counts from the database's now
    assert await env.engine.settle([Settlement(d.id, 1, Outcome.RETRY)]) == {msg_id}
    assert before < await env.engine.now()


async def test_unexpired_lease_is_not_recovered(env: Env) -> None:
    await env.publish("q")
    await env.engine.acquire(["q"], 10, 30)
    await env.passes(0.05)
    assert await env.engine.recover_expired(10) == []


async def test_expired_lease_is_recovered_to_pending_with_a_history_entry(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (first,) = await env.engine.acquire(["q"], 10, 0.2)
    await env.passes(0.3)
    assert await env.engine.recover_expired(10) == [msg_id]
    stats = await env.stats()
    assert (stats.pending, stats.processing) == (1, 0)
    (again,) = await env.engine.acquire(["q"], 10, 30)
    assert (again.id, again.deliveries, again.attempts) == (msg_id, 2, 0)
    assert again.first_attempt_at is not None and first.first_attempt_at is not None
    assert abs(again.first_attempt_at - first.first_attempt_at) < timedelta(milliseconds=2)
    assert again.acquired_at > first.acquired_at
    (entry,) = again.history
    assert {k: entry[k] for k in ("delivery", "ended")} == {"delivery": 1, "ended": "lease_expired"}
    at = datetime.fromisoformat(entry["at"])
    assert at.utcoffset() == timedelta(0)
    assert first.lease_expires_at < at <= again.acquired_at + timedelta(milliseconds=2)


async def test_recovery_takes_the_earliest_expiries_first_up_to_its_limit(env: Env) -> None:
    await env.publish("q", b"a", b"b", b"c")
    (a,) = await env.engine.acquire(["q"], 1, 0.1)
    (b,) = await env.engine.acquire(["q"], 1, 0.2)
    (c,) = await env.engine.acquire(["q"], 1, 30)
    await env.passes(0.3)
    assert await env.engine.recover_expired(1) == [a.id]
    assert await env.engine.recover_expired(10) == [b.id]
    assert await env.engine.recover_expired(10) == []
    assert (await env.stats()).processing == 1
    assert await env.engine.extend([(c.id, 1)], 30) == {c.id}


async def test_recovery_spreads_the_next_attempt_over_spread(env: Env) -> None:
    await env.publish("q", b"a", b"b", b"c")
    await env.engine.acquire(["q"], 10, 0.1)
    await env.passes(0.15)
    now = await env.engine.now()
    assert len(await env.engine.recover_expired(10, spread=60)) == 3
    oldest = (await env.stats()).oldest_ready_at
    assert oldest is not None
    assert now - timedelta(milliseconds=2) <= oldest <= now + timedelta(seconds=61)


async def test_recovery_with_no_spread_makes_the_message_ready_at_once(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    await env.engine.acquire(["q"], 10, 0.1)
    await env.passes(0.15)
    assert await env.engine.recover_expired(10) == [msg_id]
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [msg_id]


async def test_recovery_keeps_the_newest_history_entries(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    full = [{"delivery": i, "ended": "nacked", "at": f"2026-01-01T00:00:{i:02d}+00:00"}
            for i in range(HISTORY_LIMIT)]
    released = Settlement(d.id, 1, Outcome.RELEASE, attempted=False, history=full)
    assert await env.engine.settle([released]) == {msg_id}
    (d,) = await env.engine.acquire(["q"], 10, 0.1)
    assert d.history == full
    await env.passes(0.15)
    assert await env.engine.recover_expired(10) == [msg_id]
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert len(d.history) == HISTORY_LIMIT
    assert d.history[:-1] == full[1:]
    assert d.history[-1]["ended"] == "lease_expired" and d.history[-1]["delivery"] == 2


@pytest.mark.parametrize("limit", [1, 5])
async def test_recovery_returns_the_ids_it_recovered(env: Env, limit: int) -> None:
    published = await env.publish("q", b"a", b"b")
    await env.engine.acquire(["q"], 10, 0.1)
    await env.passes(0.15)
    recovered = await env.engine.recover_expired(limit)
    assert len(recovered) == min(limit, 2) and set(recovered) <= set(published)
