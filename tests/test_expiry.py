"""``publish(..., expires=…)`` end to end, on every database and the in-memory engine: a
message acquired at or after its expiry is archived EXPIRED and its handler never sees it,
whichever way it reached the subscriber (an acquire, a hand-over, a retry after the moment);
bad values are refused before anything is written."""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sqlmq import Broker, Message, PublishError, Retry, State

from .conftest import drained, on_every_engine, rows, wait_until

pytestmark = on_every_engine


async def test_expired_messages_are_archived_expired_and_never_handled(broker: Broker) -> None:
    handled: list[str] = []

    @broker.subscriber("jobs", workers=2, flush_interval=0.01)
    async def handle(msg: Message) -> None:
        handled.append(msg.body)
        if msg.body == "plain":
            assert msg.expires_at is None
        else:  # the handler sees the expiry, and runs before it
            assert msg.expires_at is not None and msg.expires_at > msg.created_at

    past = datetime.now(UTC) - timedelta(hours=1)
    await broker.publish("jobs", "stale", expires=past)
    await broker.publish("jobs", "fresh", expires=timedelta(minutes=5))
    await broker.publish("jobs", "plain")
    await broker.publish("jobs", "due-after-expiry", delay=0.4, expires=0.1)
    broker.publish_batch_sync("jobs", ["batch-stale-1", "batch-stale-2"], expires=past)
    await broker.start()
    # after the start: a publish handed straight to the idle subscriber, where the engine
    # does that, still expires (its delivery carries the expiry it was published with)
    await wait_until(lambda: drained(broker, "jobs"), message="queue drained")
    await broker.publish("jobs", "direct-fresh", expires=60)
    await broker.publish("jobs", "direct-stale", expires=past)
    await wait_until(lambda: drained(broker, "jobs"), message="queue drained again")
    await broker.stop()

    assert sorted(handled) == ["direct-fresh", "fresh", "plain"]
    archive = {r["payload"].decode(): r for r in await rows(broker, "archive")}
    expired = {p for p, r in archive.items() if r["state"] == State.EXPIRED}
    assert expired == {"stale", "due-after-expiry", "batch-stale-1", "batch-stale-2",
                       "direct-stale"}
    for name in expired:
        r = archive[name]
        assert r["error"].startswith("expired at ") and r["error"].endswith(" before it ran")
        assert r["attempts_count"] == 0  # not an attempt: the handler never ran
        assert r["history"][-1]["ended"] == "expired"
    stats = {s.queue: s for s in await broker.stats()}["jobs"]
    assert (stats.expired, stats.completed) == (5, 3)


async def test_a_retry_due_after_the_expiry_is_not_run(broker: Broker) -> None:
    """Expiry holds for every delivery, not only the first: a message whose retry comes
    after the moment is archived EXPIRED instead of running again."""
    calls: list[int] = []

    @broker.subscriber("jobs", flush_interval=0.01, retry=Retry.constant(1.5))
    async def handle(msg: Message) -> None:
        calls.append(msg.attempts)
        raise RuntimeError("fails once, then expires while it waits to retry")

    await broker.start()
    msg_id = await broker.publish("jobs", "x", expires=1.0)
    await wait_until(lambda: drained(broker, "jobs"), message="queue drained")
    await broker.stop()
    (row,) = await rows(broker, "archive", id=msg_id)
    assert row["state"] == State.EXPIRED
    # Its first delivery ran (unless this machine took over a second to deliver it, when it
    # expired at once); it never ran again.
    assert len(calls) <= 1 and row["attempts_count"] == len(calls)


@pytest.mark.parametrize(("expires", "problem"), [
    (0, "more than 0"), (-5, "more than 0"), (math.nan, "more than 0"),
    (timedelta(seconds=-1), "more than 0"), (1e12, "at most"),
    (datetime(2030, 1, 1), "timezone-aware"), ("soon", "got str"), (True, "got bool"),
])
async def test_bad_expiries_are_refused_before_anything_is_written(
    broker: Broker, expires: Any, problem: str,
) -> None:
    with pytest.raises(PublishError, match=problem):
        await broker.publish("jobs", "x", expires=expires)
    with pytest.raises(PublishError, match=problem):
        broker.publish_batch_sync("jobs", ["x", "y"], expires=expires)
    assert await rows(broker) == []


async def test_the_worker_stop_line_counts_expired_messages_as_expired(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    """An expired message is archived, not given back: the line ``sqlmq worker`` logs at
    its stop says so."""
    handled: list[str] = []

    @broker.subscriber("jobs", flush_interval=0.01)
    async def handle(msg: Message) -> None:
        handled.append(msg.body)

    past = datetime.now(UTC) - timedelta(hours=1)
    await broker.publish("jobs", "stale", expires=past)
    await broker.publish("jobs", "fresh", expires=timedelta(minutes=5))
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="sqlmq")
    running = asyncio.create_task(broker.run(stop))
    await wait_until(lambda: drained(broker, "jobs"), message="queue drained")
    stop.set()  # the stop waits for a flush in progress: both results are counted
    await running
    (line,) = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("sqlmq worker stopped after")]
    assert handled == ["fresh"]
    assert "1 completed, 0 failed, 0 retried, 1 expired, 0 given back" in line, line
