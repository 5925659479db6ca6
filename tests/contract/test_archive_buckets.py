"""``archive_buckets``: what left each queue in each bucket of a chart, counted by the
engine in one read, on the database clock."""

from __future__ import annotations

import math
from datetime import datetime

from sqlmq.lifecycle import Outcome
from sqlmq.records import Settlement
from sqlmq.views import BucketCount

from .conftest import Env


async def settle(env: Env, queue: str, *outcomes: Outcome) -> list[int]:
    """Publish one message per outcome to ``queue`` and archive each with it."""
    published = await env.publish(queue, *[b"m"] * len(outcomes))
    taken = await env.engine.acquire([queue], len(outcomes), 30)
    assert sorted(d.id for d in taken) == sorted(published)
    assert await env.engine.settle([Settlement(d.id, d.deliveries, o)
                                    for d, o in zip(taken, outcomes, strict=True)]) == set(
        published)
    return published


async def archived_at(env: Env, msg_id: int) -> datetime:
    view = await env.engine.message_view(msg_id)
    assert view is not None and view.archived_at is not None
    return view.archived_at


def possible(at: datetime, before: datetime, after: datetime, step: float) -> set[int]:
    """The buckets a row archived ``at`` may be in, read between ``before`` and ``after``."""
    return set(range(max(0, math.floor((before - at).total_seconds() / step)),
                     max(0, math.floor((after - at).total_seconds() / step)) + 1))


async def test_each_queue_counts_its_final_states_and_retries_in_the_newest_bucket(
        env: Env) -> None:
    await settle(env, "q", Outcome.COMPLETE, Outcome.COMPLETE, Outcome.FAIL, Outcome.CANCEL,
                 Outcome.EXPIRE)
    (again,) = await env.publish("other")
    (first,) = await env.engine.acquire(["other"], 1, 30)
    await env.engine.settle([Settlement(first.id, 1, Outcome.RETRY, delay=0)])
    (second,) = await env.engine.acquire(["other"], 1, 30)
    assert (second.id, second.deliveries) == (again, 2)
    await env.engine.settle([Settlement(again, 2, Outcome.COMPLETE)])
    await env.publish("idle")  # live only: not in any bucket

    found = await env.engine.archive_buckets(3600, 60)
    assert found == [BucketCount("other", 0, completed=1, retried=1),
                     BucketCount("q", 0, completed=2, failed=1, cancelled=1, expired=1)]
    assert await env.engine.archive_buckets(3600, 60, "q") == found[1:]
    assert await env.engine.archive_buckets(3600, 60, "idle") == []


async def test_older_messages_fall_in_older_buckets_and_out_of_the_span(env: Env) -> None:
    step = 0.5
    (old,) = await settle(env, "q", Outcome.COMPLETE)
    await env.passes(1.2)
    (new,) = await settle(env, "q", Outcome.FAIL)
    old_at, new_at = await archived_at(env, old), await archived_at(env, new)
    assert (new_at - old_at).total_seconds() >= 1.2

    before = await env.engine.now()
    found = await env.engine.archive_buckets(60, step)
    after = await env.engine.now()
    by_state = {("completed" if b.completed else "failed"): b for b in found}
    assert sorted(by_state) == ["completed", "failed"] and len(found) == 2
    assert by_state["completed"].index in possible(old_at, before, after, step)
    assert by_state["failed"].index in possible(new_at, before, after, step)
    assert by_state["completed"].index >= by_state["failed"].index + 2

    narrow = await env.engine.archive_buckets(1.0, step)  # the old one is over a second old
    assert [(b.queue, b.failed, b.completed) for b in narrow] in ([], [("q", 1, 0)])
