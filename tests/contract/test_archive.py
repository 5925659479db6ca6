"""The archive (requeue, purge), stats and the database clock."""

from __future__ import annotations

from datetime import timedelta

from sqlmq.lifecycle import Outcome
from sqlmq.records import Settlement

from .conftest import Env, ids


async def archive(env: Env, queue: str, *outcomes: Outcome) -> list[int]:
    """Publish one message per outcome to ``queue`` and settle each with it."""
    published = await env.publish(queue, *[o.value.encode() for o in outcomes])
    taken = await env.engine.acquire([queue], len(outcomes), 30)
    assert ids(taken) == published
    settled = [Settlement(d.id, 1, o, history=[{"delivery": 1, "ended": o.value.lower()}])
               for d, o in zip(taken, outcomes, strict=True)]
    assert await env.engine.settle(settled) == set(published)
    return published


async def test_requeue_moves_failed_messages_back_as_fresh_pending(env: Env) -> None:
    failed, completed = await archive(env, "q", Outcome.FAIL, Outcome.COMPLETE)
    assert await env.engine.requeue_archived(queue="q") == 1
    stats = await env.stats()
    assert (stats.pending, stats.failed, stats.completed) == (1, 0, 1)
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert (d.id, d.payload, d.attempts, d.deliveries) == (failed, b"FAILED", 0, 1)
    (entry,) = d.history
    assert entry.pop("at")  # the settle's time, added by the engine
    assert entry == {"delivery": 1, "ended": "failed"}
    assert completed not in ids(await env.engine.acquire(["q"], 10, 30))


async def test_requeue_filters_by_queue_ids_and_state(env: Env) -> None:
    a, b, c, done = await archive(env, "q", Outcome.FAIL, Outcome.FAIL, Outcome.FAIL,
                                  Outcome.COMPLETE)
    (other,) = await archive(env, "other", Outcome.FAIL)
    assert await env.engine.requeue_archived(ids=[a]) == 1
    assert await env.engine.requeue_archived(ids=[]) == 0
    assert await env.engine.requeue_archived(state="COMPLETED") == 1
    assert await env.engine.requeue_archived(queue="nothing-here") == 0
    assert await env.engine.requeue_archived(queue="q") == 2
    assert await env.engine.requeue_archived(queue="q") == 0
    assert set(ids(await env.engine.acquire(["q"], 10, 30))) == {a, b, c, done}
    assert (await env.stats("other")).failed == 1
    assert await env.engine.requeue_archived() == 1
    assert ids(await env.engine.acquire(["other"], 10, 30)) == [other]


async def test_purge_deletes_archived_messages_by_queue_state_and_time(env: Env) -> None:
    await archive(env, "q", Outcome.COMPLETE, Outcome.FAIL)
    await archive(env, "other", Outcome.COMPLETE)
    assert await env.engine.purge_archived(queue="other") == 1
    await env.passes(0.05)
    cutoff = await env.engine.now()
    await env.passes(0.05)
    await archive(env, "q", Outcome.COMPLETE)
    assert await env.engine.purge_archived(state="COMPLETED", before=cutoff) == 1
    assert await env.engine.purge_archived(before=cutoff) == 1
    stats = await env.stats()
    assert (stats.completed, stats.failed) == (1, 0)
    assert await env.engine.purge_archived() == 1
    assert [s.queue for s in await env.engine.stats()] == []


async def test_purge_leaves_live_messages_alone(env: Env) -> None:
    await env.publish("q", b"a", b"b")
    await env.engine.acquire(["q"], 1, 30)
    assert await env.engine.purge_archived() == 0
    stats = await env.stats()
    assert (stats.pending, stats.processing) == (1, 1)


async def test_stats_count_every_state_per_queue(env: Env) -> None:
    start = await env.engine.now()
    await archive(env, "q", Outcome.COMPLETE, Outcome.FAIL, Outcome.FAIL)
    await env.publish("q", b"retry", b"hold")
    retry, _hold = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([Settlement(retry.id, 1, Outcome.RETRY, delay=60)]) == {
        retry.id}
    await env.publish("q", b"later", delay=30)
    (ready,) = await env.publish("r")
    assert [s.queue for s in await env.engine.stats()] == ["q", "r"]
    q = await env.stats("q")
    assert (q.pending, q.processing, q.retryable, q.completed, q.failed) == (1, 1, 1, 1, 2)
    assert q.oldest_ready_at is not None
    assert start + timedelta(seconds=29) < q.oldest_ready_at  # the delayed one; hold has none
    r = await env.stats("r")
    assert (r.pending, r.processing, r.retryable, r.completed, r.failed) == (1, 0, 0, 0, 0)
    assert r.oldest_ready_at is not None
    assert start - timedelta(milliseconds=2) <= r.oldest_ready_at <= await env.engine.now()
    assert ids(await env.engine.acquire(["r"], 10, 30)) == [ready]


async def test_now_is_utc_and_moves_forward(env: Env) -> None:
    first = await env.engine.now()
    assert first.utcoffset() == timedelta(0)
    await env.passes(0.05)
    second = await env.engine.now()
    assert second - first >= timedelta(seconds=0.05)
