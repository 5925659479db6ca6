"""Topics through the broker: consumer groups in separate OS processes each handle every
message published to their topic exactly once; subscribers with ``topic=`` and ``group=``
join their group at start and see the topic on each message; bad topics, patterns and
groups are refused with errors that name them. The engine rules (fanout, late groups,
deleted groups, the caller's transaction, keys and expiry per copy) are
``tests/contract/test_topics.py``, on every engine."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from sqlalchemy import func, select

from sqlmq import Broker, ConfigurationError, Message, PublishError, UnknownGroup

from .conftest import drained, on_every_engine, wait_until
from .procs import handled_ids, ready_marker, spawn_worker, terminate, worker_log

GROUPS = ["billing", "shipping", "audit"]
PER_GROUP = 2
MESSAGES = 600


async def test_groups_in_separate_processes_each_handle_every_message_once(
    broker: Broker, db_url: str, prefix: str, tmp_path: Path,
) -> None:
    outs = {g: [tmp_path / f"{g}{i}.ids" for i in range(PER_GROUP)] for g in GROUPS}
    procs = [spawn_worker(db_url, prefix, "orders.*", out, sleep=0.001, group=g)
             for g, group_outs in outs.items() for out in group_outs]
    every_out = [o for group_outs in outs.values() for o in group_outs]
    try:
        await wait_until(lambda: all(ready_marker(o).exists() for o in every_out),
                         timeout=60, message="every worker process running its subscriber")
        assert sorted(g.group for g in await broker.groups()) == sorted(GROUPS)
        published: dict[str, list[int]] = {}

        def note(fanout: dict[str, list[int]]) -> None:
            for queue, ids in fanout.items():
                published.setdefault(queue, []).extend(ids)

        for n in range(0, MESSAGES, 100):  # single publishes, batches and the outbox
            for i in range(n, n + 10):
                note({q: [i] for q, i in (await broker.publish_topic(
                    "orders.created", {"n": i})).items()})
            note(await broker.publish_topic_batch("orders.paid", [{"n": i} for i in
                                                                  range(n + 10, n + 60)]))
            async with broker.db.begin() as conn:
                note(await broker.publish_topic_batch(
                    "orders.created", [{"n": i} for i in range(n + 60, n + 100)],
                    connection=conn))
        assert sorted(published) == sorted(f"{g}@orders.*" for g in GROUPS)
        assert all(len(ids) == MESSAGES for ids in published.values())
        for g in GROUPS:
            await wait_until(lambda g=g: drained(broker, f"{g}@orders.*"), timeout=120,
                             interval=0.2, message=f"group {g} drained")
    finally:
        codes = [terminate(p) for p in procs]
    assert codes == [0] * len(procs), [worker_log(o) for o in every_out]

    for g, group_outs in outs.items():
        per_process = [handled_ids(o) for o in group_outs]
        handled = [i for ids in per_process for i in ids]
        assert sorted(handled) == sorted(published[f"{g}@orders.*"]), \
            f"group {g}: a copy handled twice, or not at all"
    a = broker.schema.archive
    async with broker.db.connect() as conn:
        summary = (await conn.execute(
            select(a.c.queue, a.c.state, a.c.deliveries_count, func.count())
            .group_by(a.c.queue, a.c.state, a.c.deliveries_count))).all()
        again = (await conn.execute(
            select(a.c.id, a.c.queue, a.c.created_at, a.c.first_attempt_at, a.c.archived_at,
                   a.c.history).where(a.c.deliveries_count != 1).limit(5))).all()
    # A copy delivered twice but handled once: its history says how the first delivery
    # ended (lease_expired: acquired, never run, recovered), and the worker logs who had it.
    assert sorted(tuple(r) for r in summary) == sorted(
        (f"{g}@orders.*", "COMPLETED", 1, MESSAGES) for g in GROUPS), \
        (again, [worker_log(o) for o in every_out])


@on_every_engine
async def test_a_topic_subscriber_joins_its_group_and_sees_the_topic(broker: Broker) -> None:
    seen: list[tuple[str | None, str, object]] = []

    @broker.subscriber(topic=["orders.*", "refunds.#"], group="billing", workers=1)
    async def billing(msg: Message) -> None:
        seen.append((msg.topic, msg.queue, msg.body))

    with pytest.raises(UnknownGroup, match="no consumer group 'billing' of topic 'orders.*'"
                                           r" \(groups: none\)"):
        await broker.delete_group("orders.*", "billing")
    await broker.start()
    try:
        assert [(g.pattern, g.group, g.queue) for g in await broker.groups()] == [
            ("orders.*", "billing", "billing@orders.*"),
            ("refunds.#", "billing", "billing@refunds.#")]
        assert list(await broker.publish_topic("orders.created", {"id": 7})) == [
            "billing@orders.*"]
        assert await broker.publish_topic("orders.eu.created", 1) == {}  # one word only
        await asyncio.to_thread(broker.publish_topic_sync, "refunds.eu.sent", "r")  # off the loop
        await wait_until(lambda: len(seen) == 2, message="both copies handled")
        assert sorted(seen, key=str) == sorted([
            ("orders.created", "billing@orders.*", {"id": 7}),
            ("refunds.eu.sent", "billing@refunds.#", "r")], key=str)
        with pytest.raises(ConfigurationError, match="before start"):
            broker.subscriber(topic="late.*", group="g")(billing)
        await wait_until(lambda: drained(broker, "billing@orders.*"), message="settled")
        assert await broker.delete_group("orders.*", "billing") == 0
        with pytest.raises(UnknownGroup, match=r"groups: 'billing' of 'refunds.#'"):
            await broker.delete_group("orders.*", "billing")
    finally:
        await broker.stop()


@on_every_engine
async def test_bad_topics_patterns_and_groups_are_named(broker: Broker) -> None:
    for topic, problem in [("orders.*", "wildcard"), ("", "topic must not be empty"),
                           ("a..b", "empty word"), (7, "topic must be a str")]:
        with pytest.raises(PublishError, match=problem):
            await broker.publish_topic(topic, b"x")  # type: ignore[arg-type]
        with pytest.raises(PublishError, match=problem):
            broker.publish_topic_sync(topic, b"x")  # type: ignore[arg-type]
    with pytest.raises(PublishError, match="headers must be a mapping"):
        await broker.publish_topic("t", b"x", headers=[("a", "b")])  # type: ignore[arg-type]
    for kwargs, problem in [
        ({"topic": "t"}, "needs group="), ({"group": "g"}, "pass topic="),
        ({"topic": [], "group": "g"}, "at least one pattern"),
        ({"topic": "t", "group": "a@b"}, "must not contain '@'"),
        ({"topic": "t.x*", "group": "g"}, "whole word"),
        ({"topic": "t", "group": ""}, "group name must not be empty"),
        ({"topic": "t" * 128, "group": "g"}, "its queue"),
        ({}, "needs at least one queue"),
    ]:
        with pytest.raises(ConfigurationError, match=problem):
            broker.subscriber(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"pattern 'a\.\.b' has an empty word"):
        await broker.join_group("a..b", "g")
    assert await broker.groups() == [] and await broker.stats() == []


@on_every_engine
async def test_a_deleted_groups_consumer_stops_getting_copies(broker: Broker) -> None:
    got: list[int] = []

    @broker.subscriber(topic="t", group="g", workers=1)
    async def handle(msg: Message) -> None:
        got.append(msg.body)

    await broker.start()
    try:
        await broker.publish_topic("t", 1)
        await wait_until(lambda: got == [1], message="the first copy handled")
        await wait_until(lambda: drained(broker, "g@t"), message="and settled")
        assert await broker.delete_group("t", "g") == 0
        assert await broker.publish_topic("t", 2) == {}
        await asyncio.sleep(0.3)
        assert got == [1]
    finally:
        await broker.stop()


@on_every_engine
async def test_a_result_dropped_after_its_group_was_deleted_says_so(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    """A consumer still running a copy when its group is deleted finishes; its result is
    dropped, and the warning says the message was deleted while it ran, not that its lease
    expired and it was delivered again (which an operator would go looking for)."""
    caplog.set_level(logging.WARNING, logger="sqlmq")
    started, release = asyncio.Event(), asyncio.Event()

    @broker.subscriber(topic="t", group="g", workers=1, flush_interval=0.01)
    async def handle(msg: Message) -> None:
        started.set()
        await release.wait()

    await broker.start()
    (runtime,) = broker.runtimes
    try:
        (msg_id,) = (await broker.publish_topic("t", 1)).values()
        await asyncio.wait_for(started.wait(), 20)
        assert await broker.delete_group("t", "g") == 1
        release.set()
        await wait_until(lambda: runtime.counters.stale == 1, message="the result dropped")
    finally:
        release.set()
        await broker.stop()
    (warning,) = [r.getMessage() for r in caplog.records if "stale result" in r.getMessage()]
    assert warning == (f"dropped a stale result for message {msg_id} (delivery 1): the "
                       "message was deleted while it ran (its consumer group was deleted, or "
                       "it was removed by hand)")
