"""Topics and consumer groups: a topic publish leaves one copy in the queue of each group
whose pattern matches, in one transaction; a copy is then an ordinary message of its
group's queue (acquire, settle, fencing, keys and expiry per copy). Groups live in the
database: made, listed and deleted through the engine. Processes consuming groups:
``tests/test_topics.py``."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqlmq.lifecycle import Outcome
from sqlmq.records import NewMessage, NewMessages, Published, Settlement
from sqlmq.topics import group_queue

from .conftest import Env, ids


def batch(*payloads: bytes, keys: list[str | None] | None = None,
          expires_in: float | None = None) -> NewMessages:
    """Messages for a topic publish (their queue is the topic's business: ignored)."""
    return NewMessages.of([
        NewMessage("ignored", p, {"topic": "t"}, expires_in=expires_in,
                   dedup_key=None if keys is None else keys[i])
        for i, p in enumerate(payloads or (b"m",))])


async def join(env: Env, pattern: str, *groups: str) -> list[str]:
    return [(await env.engine.join_group(pattern, g)).queue for g in groups]


async def test_every_group_gets_one_copy_and_consumes_it_alone(env: Env) -> None:
    queues = await join(env, "orders.created", "billing", "shipping", "audit")
    fanout = await env.engine.publish_topic("orders.created", batch(b"a", b"b"))
    assert list(fanout) == sorted(queues)  # in queue order
    assert all(len(copies) == 2 for copies in fanout.values())
    assert len({i for copies in fanout.values() for i in copies}) == 6  # a row per copy
    billing, shipping, audit = queues
    got = await env.engine.acquire([billing], 10, 30)
    assert ids(got) == fanout[billing] and [d.payload for d in got] == [b"a", b"b"]
    assert all(d.queue == billing and d.headers["topic"] == "t" for d in got)
    assert await env.engine.acquire([billing], 10, 30) == []  # the group's copies are taken
    assert ids(await env.engine.acquire([shipping, audit], 10, 30)) == sorted(
        fanout[shipping] + fanout[audit])


async def test_patterns_match_words_with_star_and_hash(env: Env) -> None:
    star, = await join(env, "orders.*", "g")
    hash_, = await join(env, "orders.#", "g")
    tail, = await join(env, "#.created", "g")
    other, = await join(env, "payments.*", "g")
    assert sorted(await env.engine.publish_topic("orders.created", batch())) == sorted(
        [star, hash_, tail])
    assert sorted(await env.engine.publish_topic("orders", batch())) == [hash_]
    assert sorted(await env.engine.publish_topic("orders.eu.created", batch())) == sorted(
        [hash_, tail])
    assert await env.engine.publish_topic("payments.sent.late", batch()) == {}
    assert (await env.stats(other)).pending == 0


async def test_a_topic_without_groups_writes_nothing(env: Env) -> None:
    assert await env.engine.publish_topic("nobody.listens", batch(b"x")) == {}
    assert await env.engine.stats() == []


async def test_a_group_made_later_gets_only_later_messages(env: Env) -> None:
    (early,) = await join(env, "t", "early")
    await env.engine.publish_topic("t", batch(b"before"))
    (late,) = await join(env, "t", "late")
    await env.engine.publish_topic("t", batch(b"after"))
    assert [d.payload for d in await env.engine.acquire([early], 10, 30)] == [b"before",
                                                                              b"after"]
    assert [d.payload for d in await env.engine.acquire([late], 10, 30)] == [b"after"]


async def test_joining_again_keeps_the_group(env: Env) -> None:
    first = await env.engine.join_group("t.*", "g")
    again = await env.engine.join_group("t.*", "g")
    assert again == first and first.queue == group_queue("t.*", "g") == "g@t.*"
    await env.engine.join_group("a", "z")
    assert [(g.pattern, g.group) for g in await env.engine.topic_groups()] == [
        ("a", "z"), ("t.*", "g")]


async def test_deleting_a_group_removes_its_copies_and_stops_its_fanout(env: Env) -> None:
    gone, kept = await join(env, "t", "gone", "kept")
    await env.engine.publish_topic("t", batch(b"1", b"2", b"3"))
    (running, *_) = await env.engine.acquire([gone], 1, 30)
    assert await env.engine.delete_group("t", "gone") == 3  # waiting and running alike
    assert await env.engine.delete_group("t", "gone") is None
    assert await env.engine.delete_group("never", "made") is None
    # its consumer's late result is stale: fenced like any other
    assert await env.engine.settle([Settlement(running.id, running.deliveries,
                                               Outcome.COMPLETE)]) == set()
    assert list(await env.engine.publish_topic("t", batch(b"4"))) == [kept]
    assert (await env.stats(gone)).pending == 0
    assert (await env.stats(kept)).pending == 4
    assert [g.queue for g in await env.engine.topic_groups()] == [kept]


async def test_copies_settle_retry_and_fail_on_their_own(env: Env) -> None:
    a, b = await join(env, "t", "a", "b")
    await env.engine.publish_topic("t", batch())
    (da,) = await env.engine.acquire([a], 10, 30)
    (db,) = await env.engine.acquire([b], 10, 30)
    assert await env.engine.settle([Settlement(da.id, da.deliveries, Outcome.RETRY,
                                               delay=0)]) == {da.id}
    assert await env.engine.settle([Settlement(db.id, db.deliveries, Outcome.FAIL)]) == {db.id}
    (again,) = await env.engine.acquire([a], 10, 30)
    assert again.id == da.id and again.deliveries == 2
    assert (await env.stats(b)).failed == 1 and (await env.stats(a)).failed == 0


async def test_a_deduplication_key_holds_per_group(env: Env) -> None:
    a, b = await join(env, "t", "a", "b")
    first = await env.engine.publish_topic("t", batch(keys=["k"]))
    again = await env.engine.publish_topic("t", batch(keys=["k"]))
    assert again == first
    assert all(isinstance(i, Published) and i.duplicate for (i,) in again.values())
    (da,) = await env.engine.acquire([a], 10, 30)
    await env.engine.settle([Settlement(da.id, da.deliveries, Outcome.COMPLETE)])
    third = await env.engine.publish_topic("t", batch(keys=["k"]))
    assert third[a][0].duplicate is False and third[a][0] != first[a][0]  # a's key is free
    assert third[b] == first[b] and third[b][0].duplicate is True


async def test_each_copy_carries_its_expiry(env: Env) -> None:
    a, b = await join(env, "t", "a", "b")
    before = await env.engine.now()
    await env.engine.publish_topic("t", batch(expires_in=60))
    (da,) = await env.engine.acquire([a], 10, 30)
    (db,) = await env.engine.acquire([b], 10, 30)
    for d in (da, db):  # now + 60 s, each at its own INSERT's now (SQLite, MariaDB)
        assert d.expires_at is not None and 59 < (d.expires_at - before).total_seconds() < 61
    assert await env.engine.settle([Settlement(db.id, db.deliveries, Outcome.EXPIRE)]) == {
        db.id}
    assert (await env.stats(b)).expired == 1 and (await env.stats(a)).processing == 1


async def test_a_topic_publish_in_the_callers_transaction_is_all_or_nothing(env: Env) -> None:
    a, b = await join(env, "t", "a", "b")
    async with env.outbox_db.connect() as conn:
        await conn.begin()
        rolled = await env.engine.publish_topic("t", batch(b"no"), conn)
        assert sorted(rolled) == [a, b]
        await conn.rollback()
    async with env.outbox_db.begin() as conn:
        await env.engine.publish_topic("t", batch(b"yes"), conn)
    async with AsyncSession(env.outbox_db) as session, session.begin():
        await env.engine.publish_topic("t", batch(b"session"), session)
    with env.outbox_sync_db.begin() as sync_conn:
        env.engine.publish_topic_sync("t", batch(b"sync"), sync_conn)
    with Session(env.outbox_sync_db) as sync_session:
        env.engine.publish_topic_sync("t", batch(b"dropped"), sync_session)
        sync_session.rollback()
    env.engine.publish_topic_sync("t", batch(b"own"))
    for queue in (a, b):
        assert [d.payload for d in await env.engine.acquire([queue], 10, 30)] == [
            b"yes", b"session", b"sync", b"own"]


@pytest.mark.parametrize("pattern", ["", "a..b", ".a", "a.b*", "a.#x"])
async def test_bad_patterns_are_refused_before_anything_is_written(env: Env,
                                                                   pattern: str) -> None:
    from sqlmq.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="pattern"):
        await env.engine.join_group(pattern, "g")
    assert await env.engine.topic_groups() == []
