"""PostgreSQL backends killed under sqlmq (``pg_terminate_backend``): an ordinary
disconnection. The connection is discarded with one warning line and no traceback; a
statement that never reached the server runs again on another connection; a publish whose
outcome is unknown (lost after it was sent, before its commit was confirmed) raises
:class:`PublishOutcomeUnknown` instead of asyncpg's internal error, and one that provably
committed nothing (a COPY lost before its COMMIT) is sent again.

Only this test's connections are touched: they carry its own ``application_name``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, make_url, text

from sqlmq import Broker, ChannelSettings, Message, Outcome, PublishOutcomeUnknown, Settlement

from .conftest import rows, wait_until

pytestmark = pytest.mark.parametrize("db_kind", ["postgresql"])


@pytest.fixture
async def victim(broker: Broker, db_url: str, prefix: str) -> AsyncIterator[Broker]:
    """A broker on the test's tables whose connections carry the test's own name."""
    b = Broker(make_url(db_url).update_query_dict({"application_name": _tag(prefix)}),
               table_prefix=prefix, recovery_interval=0.5)
    try:
        yield b
    finally:
        await b.close()


def _tag(prefix: str) -> str:
    return f"sqlmq_{prefix}"[:60]


async def _terminate(observer: Broker, prefix: str, where: str = "TRUE") -> int:
    async with observer.db.connect() as conn:
        return len((await conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
            "datname = current_database() AND pid <> pg_backend_pid() AND application_name = "
            f":tag AND {where}"), {"tag": _tag(prefix)})).all())


async def _backends(observer: Broker, prefix: str, where: str = "TRUE") -> int:
    async with observer.db.connect() as conn:
        return (await conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            f"AND application_name = :tag AND {where}"), {"tag": _tag(prefix)})).scalar_one()


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_connections_killed_while_idle_are_replaced_without_an_error(
    broker: Broker, victim: Broker, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The kept connections of acquire, settle and publish die while idle: the next call of
    each finds its connection dead before sending anything, and runs on another."""
    caplog.set_level(logging.WARNING, logger="sqlmq")
    engine = victim.engine
    for round_ in range(3):
        await victim.publish_batch("q", [b"x"] * 3)
        await victim.publish_batch("q", [b"y"] * 250)  # by COPY
        got = await engine.acquire(["q"], 1000, 30.0)
        assert len(got) == 253
        assert await _terminate(broker, prefix) >= 1
        await wait_until(lambda: _gone(broker, prefix), message="the backends gone")
        settled = await engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE)
                                       for d in got])
        assert settled == {d.id for d in got}, round_
        await _terminate(broker, prefix)
        await wait_until(lambda: _gone(broker, prefix), message="the backends gone")
    assert len(await rows(broker, "archive")) == 3 * 253
    assert await rows(broker, "message") == []
    assert _tracebacks(caplog) == []
    assert any("discarded it" in r.getMessage() for r in caplog.records)


async def _gone(observer: Broker, prefix: str) -> bool:
    return await _backends(observer, prefix) == 0


async def test_a_publish_killed_after_it_was_sent_says_its_outcome_is_unknown(
    broker: Broker, victim: Broker, prefix: str
) -> None:
    """The INSERT waits for a table lock, so it is on the server when its backend is
    killed: whether it committed cannot be known from here, and the error says so."""
    m = broker.schema.message.name
    await victim.publish("q", b"warm-up")  # the table exists for the victim's statements
    async with broker.db.connect() as blocker:
        await blocker.execute(text(f"LOCK TABLE {m} IN ACCESS EXCLUSIVE MODE"))
        publish = asyncio.create_task(victim.publish("q", b"in doubt"))
        await wait_until(lambda: _waiting(broker, prefix, 1), message="the publish waiting")
        assert await _terminate(broker, prefix, "wait_event_type = 'Lock'") == 1
        with pytest.raises(PublishOutcomeUnknown, match="may or may not have been written"):
            await publish
        await blocker.rollback()
    assert [r["payload"] for r in await rows(broker, "message")] == [b"warm-up"]


async def test_a_copy_killed_before_its_commit_is_sent_again(
    broker: Broker, victim: Broker, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A COPY lost before its COMMIT wrote nothing (the server rolled it back): the publish
    runs again on another connection, and every message is there once."""
    caplog.set_level(logging.WARNING, logger="sqlmq")
    m = broker.schema.message.name
    await victim.publish("q", b"warm-up")
    async with broker.db.connect() as blocker:
        await blocker.execute(text(f"LOCK TABLE {m} IN ACCESS EXCLUSIVE MODE"))
        publish = asyncio.create_task(victim.publish_batch("q", [b"c"] * 300))
        await wait_until(lambda: _waiting(broker, prefix, 1), message="the COPY waiting")
        assert await _terminate(broker, prefix, "wait_event_type = 'Lock'") == 1
        await wait_until(lambda: _waiting(broker, prefix, 1), message="the COPY sent again")
        await blocker.rollback()
    ids = await publish
    assert len(ids) == 300
    assert sorted(r["id"] for r in await rows(broker, "message", payload=b"c")) == sorted(ids)
    assert _tracebacks(caplog) == []


async def _waiting(observer: Broker, prefix: str, n: int) -> bool:
    return await _backends(observer, prefix, "wait_event_type = 'Lock'") >= n


async def test_a_draining_subscriber_logs_killed_connections_without_tracebacks(
    broker: Broker, victim: Broker, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The backends die again and again under a draining subscriber and a publisher: no
    traceback, nothing lost, no publish fails with anything but PublishOutcomeUnknown."""
    caplog.set_level(logging.WARNING, logger="sqlmq")
    handled: list[int] = []
    published = await broker.publish_batch("drain", range(2000))

    @victim.subscriber("drain", workers=4, lease=3.0, flush_interval=0.02)
    async def handle(msg: Message) -> None:
        await asyncio.sleep(0.002)
        handled.append(msg.id)

    async def publisher() -> None:  # ~6,000 messages in all: work through the kills (2-3 s)
        for i in range(100):
            try:
                published.extend(await victim.publish_batch("drain", [i] * (5 if i % 2 else 80)))
            except PublishOutcomeUnknown:
                pass  # not counted: it may or may not be there
            await asyncio.sleep(0.01)

    await victim.start()
    try:
        publishing = asyncio.create_task(publisher())
        for _ in range(20):
            await _terminate(broker, prefix)
            await asyncio.sleep(0.1)
        await publishing
        await wait_until(lambda: _archived_all(broker, published), timeout=120, interval=0.1,
                         message="every message published archived")
    finally:
        await victim.stop()
    assert set(published) <= set(handled)
    assert _tracebacks(caplog) == []
    assert not [r for r in caplog.records if "cannot switch to state" in r.getMessage()
                and "discarded it" not in r.getMessage()]


async def _archived_all(observer: Broker, ids: list[int]) -> bool:
    archived = {r["id"] for r in await rows(observer, "archive")}
    return set(ids) <= archived


async def test_every_kept_connection_killed_costs_one_retry_not_one_each(
    broker: Broker, victim: Broker, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A burst keeps 20 connections; all are killed. The first publish after it finds its
    connection dead, hands the other kept ones back to the pool (whose pre-ping replaces
    them) and runs on a fresh one; none of the publishes fails."""
    caplog.set_level(logging.WARNING, logger="sqlmq")
    await asyncio.gather(*(victim.publish("q", str(i)) for i in range(20)))
    assert len(victim.engine._kept) >= 10  # type: ignore[attr-defined]
    assert await _terminate(broker, prefix) >= 10
    await wait_until(lambda: _gone(broker, prefix), message="the backends gone")
    for i in range(3):
        await victim.publish("q", f"after {i}")
    await asyncio.gather(*(victim.publish("q", str(i)) for i in range(20)))
    assert len(await rows(broker)) == 43
    assert not _tracebacks(caplog)



async def test_channel_and_cancel_calls_run_again_when_a_pooled_connection_is_dead(
    victim: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """The channels' acquire, their settings and the cancellation calls run on pool
    connections: one the server ended while it sat in the pool can fail the pool's
    pre-ping with asyncpg's ``cannot switch to state`` before anything is sent, which the
    pool passes on. Each call runs again on another connection, where the fetch loop had
    logged ``fetch for drain failed (InternalClientError: cannot switch to state 11; ...)``
    in CI. That pre-ping failure is raised here at check-out (the server's timing decides
    whether a real kill lands in its window); the statements run on PostgreSQL."""
    caplog.set_level(logging.WARNING, logger="sqlmq")
    engine = victim.engine
    await victim.set_channel("c", max_concurrency=5)
    ids = [await victim.publish("q", b"x", channel="c") for _ in range(2)]
    dead = [0]

    def checkout(*_: object) -> None:
        if dead[0]:
            dead[0] -= 1
            raise asyncpg.InternalClientError(
                "cannot switch to state 11; another operation (2) is in progress")

    event.listen(victim.db.sync_engine.pool, "checkout", checkout)
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: engine.acquire(["q"], 1, 30.0),
        lambda: engine.cancel_requests(ids),
        engine.channels,
        engine.channel_defaults,
        lambda: engine.set_channel("c", None, ChannelSettings(max_concurrency=4)),
        lambda: engine.set_channel_default("q", ChannelSettings(rate=5.0)),
        lambda: engine.cancel(ids[1]),
    ]
    results = []
    for call in calls:
        engine._lookouts.channels.seen = False  # the acquire looks for channels again
        engine._lookouts.channels.looked_at = float("-inf")
        dead[0] = 1
        results.append(await call())
        assert dead[0] == 0
    assert [d.id for d in results[0]] == [ids[0]]
    assert results[1] == set()
    assert [c.name for c in results[2]] == ["c"]
    assert results[4] is True
    assert results[6].outcome == "cancelled"
    assert await engine.channel_defaults() == {"q": ChannelSettings(rate=5.0)}
    assert len([r for r in caplog.records if "discarded it" in r.getMessage()]) == len(calls)
    assert _tracebacks(caplog) == []
