"""``Broker("memory://")`` as a user's unit test would drive it: no database, handlers run
by the real subscriber runtime, time moved forward instead of slept through."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from sqlmq import Broker, PublishError, Retry
from sqlmq.engines.memory.engine import MemoryEngine

from .conftest import wait_until


async def queue_stats(broker: Broker, queue: str) -> Any:
    return next(s for s in await broker.stats() if s.queue == queue)


async def test_published_message_is_handled() -> None:
    broker = Broker("memory://")
    handled: list[Any] = []

    @broker.subscriber("orders")
    async def charge(order: dict[str, int]) -> None:
        handled.append(order)

    assert isinstance(broker.engine, MemoryEngine)
    await broker.migrate()
    await broker.start()
    try:
        msg_id = await broker.publish("orders", {"id": 7})
        await wait_until(lambda: handled, message="the handler ran")
    finally:
        await broker.stop()
    assert handled == [{"id": 7}]
    stats = await queue_stats(broker, "orders")
    assert (stats.pending, stats.processing, stats.completed) == (0, 0, 1)
    assert msg_id >= 1
    await broker.close()


async def test_messages_published_before_start_wait_for_the_subscriber() -> None:
    async with Broker("memory://") as broker:
        bodies = [f"m{i}" for i in range(20)]
        await broker.publish_batch("q", bodies)
        seen: list[str] = []

        @broker.subscriber("q", workers=1)
        async def handle(body: str) -> None:
            seen.append(body)

        await broker.start()
        await wait_until(lambda: len(seen) == 20, message="every message handled")
        await broker.stop()
        assert seen == bodies  # one worker: publish order


async def test_failing_handler_is_retried_until_failed() -> None:
    async with Broker("memory://") as broker:
        calls: list[int] = []

        @broker.subscriber("jobs", retry=Retry.constant(0, max_attempts=3))
        async def flaky(body: str) -> None:
            calls.append(1)
            raise RuntimeError("always fails")

        await broker.start()
        await broker.publish("jobs", "work")

        async def failed() -> bool:
            return (await queue_stats(broker, "jobs")).failed == 1

        await wait_until(failed, message="the message archived FAILED")
        await broker.stop()
        assert len(calls) == 3
        stats = await queue_stats(broker, "jobs")
        assert (stats.pending, stats.retryable, stats.completed) == (0, 0, 0)


async def test_delayed_message_runs_when_the_clock_is_advanced() -> None:
    async with Broker("memory://") as broker:
        engine = broker.engine
        assert isinstance(engine, MemoryEngine)
        handled: list[str] = []

        @broker.subscriber("reminders")
        async def remind(body: str) -> None:
            handled.append(body)

        await broker.start()
        await broker.publish("reminders", "tomorrow", delay=24 * 3600)
        await asyncio.sleep(0.1)
        assert handled == []
        engine.advance(24 * 3600)
        await wait_until(lambda: handled, message="the delayed message handled")
        await broker.stop()
        assert handled == ["tomorrow"]


async def test_publish_sync_from_another_thread_is_handled() -> None:
    async with Broker("memory://") as broker:
        handled: list[str] = []

        @broker.subscriber("q")
        async def handle(body: str) -> None:
            handled.append(body)

        await broker.start()
        await asyncio.to_thread(broker.publish_sync, "q", "from a thread")
        await wait_until(lambda: handled, message="the sync publish handled")
        await broker.stop()
        assert handled == ["from a thread"]


async def test_outbox_publish_is_handled_only_after_the_commit() -> None:
    app_db = create_async_engine("sqlite+aiosqlite://")  # the application's own database
    async with Broker("memory://") as broker:
        handled: list[str] = []

        @broker.subscriber("q")
        async def handle(body: str) -> None:
            handled.append(body)

        await broker.start()
        async with app_db.connect() as conn:
            await conn.begin()
            await broker.publish("q", "rolled back", connection=conn)
            await conn.rollback()
        async with app_db.begin() as conn:
            await broker.publish("q", "committed", connection=conn)
            await asyncio.sleep(0.05)
            assert handled == []
        await wait_until(lambda: handled, message="the committed message handled")
        await asyncio.sleep(0.05)
        await broker.stop()
        assert handled == ["committed"]
    await app_db.dispose()


async def test_a_workflow_name_taken_by_an_uncommitted_publish_is_refused_until_rollback(
) -> None:
    """Two callers' transactions publishing one workflow name: the second is refused while
    the first is open (on a database the second waits for the first's commit, then is
    refused), and free again once the first rolled back."""
    app_db = create_async_engine("sqlite+aiosqlite://")
    async with Broker("memory://") as broker:
        async with app_db.connect() as first:
            await first.begin()
            flow = broker.workflow("order-1")
            flow.add("q", "a")
            await flow.publish(connection=first)
            again = broker.workflow("order-1")
            again.add("q", "a")
            with pytest.raises(PublishError, match="exists already"):
                await again.publish()
            await first.rollback()
        retry = broker.workflow("order-1")
        retry.add("q", "a")
        (step_id,) = (await retry.publish()).values()
        assert [s.id for s in (await broker.workflow_status("order-1")).steps] == [step_id]
    await app_db.dispose()
