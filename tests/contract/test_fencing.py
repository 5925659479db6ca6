"""Fencing: every write after acquisition is conditional on ``(id, deliveries)`` and state
PROCESSING, and returns the ids it wrote; a stale holder writes nothing."""

from __future__ import annotations

from sqlmq.lifecycle import Outcome
from sqlmq.records import Delivery, Settlement, Whereabouts

from .conftest import Env, ids


async def redelivered(env: Env) -> tuple[Delivery, Delivery]:
    """A message whose first delivery's lease expired and which was delivered again."""
    await env.publish("q")
    (first,) = await env.engine.acquire(["q"], 10, 0.2)
    await env.passes(0.3)
    assert await env.engine.recover_expired(10) == [first.id]
    (second,) = await env.engine.acquire(["q"], 10, 30)
    assert (second.id, second.deliveries) == (first.id, 2)
    return first, second


async def test_stale_settlement_is_dropped_and_not_returned(env: Env) -> None:
    first, second = await redelivered(env)
    for outcome in Outcome:
        assert await env.engine.settle([Settlement(first.id, 1, outcome)]) == set()
    stats = await env.stats()
    assert (stats.processing, stats.completed, stats.failed) == (1, 0, 0)
    assert await env.engine.settle([Settlement(second.id, 2, Outcome.COMPLETE)]) == {second.id}
    assert (await env.stats()).completed == 1


async def test_extend_with_a_stale_token_returns_nothing(env: Env) -> None:
    first, second = await redelivered(env)
    assert await env.engine.extend([(first.id, first.deliveries)], 60) == set()
    assert await env.engine.extend([(second.id, second.deliveries)], 60) == {second.id}


async def test_a_settled_delivery_cannot_be_settled_again(env: Env) -> None:
    await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([Settlement(d.id, 1, Outcome.RETRY)]) == {d.id}
    assert await env.engine.settle([Settlement(d.id, 1, Outcome.COMPLETE)]) == set()
    assert await env.engine.extend([(d.id, 1)], 60) == set()
    stats = await env.stats()
    assert (stats.retryable, stats.completed) == (1, 0)


async def test_settle_batch_returns_only_the_ids_that_landed(env: Env) -> None:
    await env.publish("q", b"a", b"b", b"c", b"d")
    a, b, c, d = await env.engine.acquire(["q"], 10, 30)
    applied = await env.engine.settle([
        Settlement(a.id, 1, Outcome.COMPLETE),
        Settlement(b.id, 2, Outcome.FAIL),  # not its delivery
        Settlement(c.id, 1, Outcome.RETRY, delay=60),
        Settlement(d.id, 0, Outcome.RELEASE),  # not its delivery
        Settlement(10**9, 1, Outcome.COMPLETE),  # no such message
    ])
    assert applied == {a.id, c.id}
    stats = await env.stats()
    assert (stats.processing, stats.retryable, stats.completed, stats.failed) == (2, 1, 1, 0)


async def test_extend_returns_only_the_leases_it_pushed(env: Env) -> None:
    await env.publish("q", b"a", b"b")
    a, b = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.extend([(a.id, 1), (b.id, 5), (10**9, 1)], 60) == {a.id}
    assert await env.engine.extend([], 60) == set()
    assert await env.engine.settle([]) == set()


async def test_landed_shows_the_results_each_delivery_wrote(env: Env) -> None:
    await env.publish("q", b"a", b"b", b"c", b"d", b"e")
    taken = await env.engine.acquire(["q"], 10, 30)
    batch = [
        Settlement(taken[0].id, 1, Outcome.COMPLETE),
        Settlement(taken[1].id, 1, Outcome.FAIL, error="bad"),
        Settlement(taken[2].id, 1, Outcome.RETRY, delay=60),
        Settlement(taken[3].id, 1, Outcome.RELEASE, refund=True, attempted=False),
        Settlement(taken[4].id, 1, Outcome.RELEASE, attempted=False),
    ]
    assert await env.engine.settle(batch) == set(ids(taken))
    assert await env.engine.landed(batch) == set(ids(taken))
    # the same outcomes claimed by another delivery number did not land
    other = [Settlement(s.id, 2, s.outcome, refund=s.refund) for s in batch]
    assert await env.engine.landed(other) == set()
    # an archive outcome claimed for a message that went elsewhere did not land either
    assert await env.engine.landed([Settlement(taken[2].id, 1, Outcome.COMPLETE)]) == set()


async def test_landed_does_not_mistake_a_recovery_for_a_release(env: Env) -> None:
    await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 0.2)
    await env.passes(0.3)
    assert await env.engine.recover_expired(10) == [d.id]
    # the row is PENDING at delivery 1, as a release would leave it, but recovery put it there
    assert await env.engine.landed([Settlement(d.id, 1, Outcome.RELEASE)]) == set()
    assert await env.engine.landed([Settlement(d.id, 1, Outcome.RETRY)]) == set()
    assert await env.engine.landed([Settlement(d.id, 1, Outcome.COMPLETE)]) == set()


async def test_whereabouts_says_where_each_message_is_now(env: Env) -> None:
    """What the runtime reads to say why a result was dropped: a live row's state and
    delivery count, an archived one's, and nothing for an id in neither."""
    first, _ = await redelivered(env)
    await env.publish("q")
    (other,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([Settlement(other.id, 1, Outcome.CANCEL)]) == {other.id}
    found = await env.engine.whereabouts([first.id, other.id, other.id + 1000])
    assert found == {first.id: Whereabouts("PROCESSING", 2),
                     other.id: Whereabouts("CANCELLED", 1)}
    assert await env.engine.whereabouts([]) == {}
