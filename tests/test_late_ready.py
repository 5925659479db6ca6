"""Messages that become ready behind the ones a consumer has already taken are still
delivered: a publish whose transaction commits long after it began, a row another session
held locked while acquires passed it, a ready time already in the past, a priority level no
acquire has seen yet.

On PostgreSQL these are the cases the acquire floors must not lose (see
:mod:`sqlmq.engines.postgresql.floors`): each test first lets acquires raise the floors past the
late message, with the floors' margin and sweep interval shortened so the test runs in a
second; without the sweep, or with a gap probe that missed new levels, the message would
never be taken. The other engines have no floors and must pass the same tests.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from sqlmq import Broker, Message
from sqlmq.engines.postgresql.engine import PostgresEngine
from sqlmq.engines.postgresql.floors import SWEEP_SPACING

from .conftest import on_every_engine, wait_until

MARGIN = 0.2  # the floors' margin and sweep interval in these tests, on PostgreSQL


def quick_floors(broker: Broker) -> None:
    engine = broker.engine
    if isinstance(engine, PostgresEngine):
        engine.floors.margin = MARGIN
        engine.floors.sweep_every = MARGIN


async def consume_past(broker: Broker, queue: str, seconds: float) -> None:
    """Publish and acquire (and settle) messages of ``queue`` for ``seconds``: each acquire
    comes back short, which raises a floor to its time."""
    engine = broker.engine
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        await broker.publish(queue, "filler")
        for d in await engine.acquire([queue], 10, 30.0):
            assert d.payload == b"filler", d
        await asyncio.sleep(0.02)


async def consume_until(broker: Broker, queue: str, done: Callable[[], bool],
                        message: str) -> None:
    """Publish and acquire messages of ``queue`` until ``done()``: a sweep is started by an
    acquire ``MARGIN`` after the floors were set, so a fixed time of consuming can pass
    without one when the machine is loaded (one or two acquires in 0.6 s)."""
    async def consumed() -> bool:
        await consume_past(broker, queue, MARGIN / 4)
        return done()

    await wait_until(consumed, message=message)


def sweep_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The lines logged for failed sweeps."""
    return [r for r in caplog.records if "sweep below the acquire floors" in r.message]


async def take(broker: Broker, queue: str, body: str, timeout: float = 10.0) -> Any:
    """Acquire ``queue`` until the message with ``body`` comes (others are dropped)."""
    found: list[Any] = []

    async def got_it() -> bool:
        found.extend(d for d in await broker.engine.acquire([queue], 10, 30.0)
                     if d.payload == body.encode())
        return bool(found)

    await wait_until(got_it, timeout=timeout, message=f"{body!r} acquired")
    return found[0]


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_a_publish_committed_long_after_its_transaction_began_is_delivered(
    broker: Broker
) -> None:
    """PostgreSQL stamps a publish with its transaction's start, so the message becomes
    visible with a ready time far below what acquires have passed since. (SQLite: a write
    transaction holds the database, nothing else is published meanwhile.)"""
    quick_floors(broker)
    async with broker.db.connect() as conn:
        await conn.begin()
        await conn.execute(text("SELECT 1"))  # the transaction's time is fixed from here
        await consume_past(broker, "jobs", 5 * MARGIN)
        await broker.publish("jobs", "late", connection=conn)
        await consume_past(broker, "jobs", 2 * MARGIN)
        await conn.commit()
    await take(broker, "jobs", "late")


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_a_message_skipped_while_another_session_held_its_row_lock_is_delivered(
    broker: Broker
) -> None:
    """A concurrent acquire that locked a message and then rolled back (here: a session
    that locks it and rolls back) leaves it ready below the acquires that skipped it."""
    quick_floors(broker)
    msg_id = await broker.publish("jobs", "skipped")
    m = broker.schema.message.name
    async with broker.db.connect() as conn:
        await conn.begin()
        await conn.execute(text(f"SELECT id FROM {m} WHERE id = {msg_id} FOR UPDATE"))
        await consume_past(broker, "jobs", 5 * MARGIN)
        await conn.rollback()
    await take(broker, "jobs", "skipped")


@on_every_engine
async def test_a_message_published_with_a_ready_time_long_past_is_delivered(
    broker: Broker
) -> None:
    quick_floors(broker)
    await consume_past(broker, "jobs", 5 * MARGIN)
    await broker.publish("jobs", "overdue", at=datetime.now(UTC) - timedelta(hours=1))
    await take(broker, "jobs", "overdue")


@on_every_engine
async def test_a_priority_level_first_seen_after_acquires_is_taken_first(
    broker: Broker, db_url: str, prefix: str
) -> None:
    """The gap probe: a level published after the acquires learned the queue's levels comes
    first at the very next acquire, not a sweep later."""
    quick_floors(broker)
    engine = broker.engine
    if isinstance(engine, PostgresEngine):
        engine.floors.sweep_every = 3600.0  # no sweep: the acquire itself must find it
    await broker.publish_batch("jobs", ["low-1", "low-2"], priority=0)
    await broker.publish("jobs", "lowest", priority=-5)
    assert [d.payload for d in await engine.acquire(["jobs"], 1, 30.0)] == [b"low-1"]
    await broker.publish("jobs", "urgent", priority=7)
    await broker.publish("jobs", "below", priority=-2)
    taken = [d.payload for d in await engine.acquire(["jobs"], 1, 30.0)]
    assert taken == [b"urgent"]
    taken = [d.payload for d in await engine.acquire(["jobs"], 10, 30.0)]
    assert taken == [b"low-2", b"below", b"lowest"]


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_a_failing_sweep_is_logged_once_and_runs_again(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """A database error (here: a missing table) is one line per incident, as the loops'
    Backoff logs it (a killed connection is the everyday case); the sweeps go on, and the
    first that works again says so and finds the message."""
    engine = broker.engine
    assert isinstance(engine, PostgresEngine)
    quick_floors(broker)
    statement = engine._sweep_below
    engine._sweep_below = statement.replace(broker.schema.message.name, "no_such_table")
    with caplog.at_level(logging.WARNING, logger="sqlmq"):
        await consume_until(broker, "jobs", lambda: bool(sweep_failures(caplog)),
                            "a failed sweep logged")
        await broker.publish("jobs", "overdue", at=datetime.now(UTC) - timedelta(hours=1))
        await consume_past(broker, "jobs", 3 * MARGIN)
        logged = sweep_failures(caplog)
        assert len(logged) == 1, caplog.text
        assert "no_such_table" in logged[0].message and logged[0].exc_info is None
        engine._sweep_below = statement
        await take(broker, "jobs", "overdue")
    assert "the sweep below the acquire floors recovered after" in caplog.text


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_a_sweep_failing_with_anything_but_a_database_error_logs_its_traceback(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    engine = broker.engine
    assert isinstance(engine, PostgresEngine)
    quick_floors(broker)

    async def broken(queue: str, levels: list[int], floors: list[float]) -> list[Any]:
        raise RuntimeError("a bug in the sweep")

    engine._sweep = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="sqlmq"):
        await consume_until(broker, "jobs", lambda: bool(sweep_failures(caplog)),
                            "a failed sweep logged")
    logged = sweep_failures(caplog)
    assert logged and logged[0].exc_info is not None, caplog.text
    assert "a bug in the sweep" in caplog.text


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_closing_the_engine_stops_a_sweep_under_way(broker: Broker) -> None:
    engine = broker.engine
    assert isinstance(engine, PostgresEngine)
    quick_floors(broker)
    engine._sweep_below = ("SELECT 0, CAST(NULL AS FLOAT8) FROM (SELECT pg_sleep(60), "
                           "CAST($1 AS TEXT), CAST($2 AS INTEGER[]), CAST($3 AS FLOAT8[])) AS x")

    def sweeping() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if "sweep below floors" in t.get_name()]

    await consume_until(broker, "jobs", lambda: bool(sweeping()), "a sweep under way")
    swept = sweeping()
    await asyncio.wait_for(broker.close(), 10)
    assert all(t.done() for t in swept)


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_a_slow_sweep_puts_the_next_one_off(broker: Broker) -> None:
    """Behind a held snapshot each sweep reads more dead entries; one that took ``d``
    seconds is followed by the next no sooner than ``SWEEP_SPACING * d`` later, so that
    sweeping keeps to a share of the database's time (here a statement that takes 50 ms:
    the next one a second later, not the interval of 0.2 s after it)."""
    engine = broker.engine
    assert isinstance(engine, PostgresEngine)
    quick_floors(broker)
    engine._sweep_below = ("SELECT 0, CAST(NULL AS FLOAT8) FROM (SELECT pg_sleep(0.05), "
                           "CAST($1 AS TEXT), CAST($2 AS INTEGER[]), CAST($3 AS FLOAT8[])) AS x")
    sweep, loop = engine._sweep, asyncio.get_running_loop()
    spans: list[tuple[float, float]] = []

    async def timed(queue: str, levels: list[int], floors: list[float]) -> list[Any]:
        began = loop.time()
        try:
            return await sweep(queue, levels, floors)
        finally:
            spans.append((began, loop.time()))

    engine._sweep = timed  # type: ignore[method-assign]
    await consume_until(broker, "jobs", lambda: len(spans) >= 2, "two sweeps")
    for (began, ended), (after, _) in itertools.pairwise(spans):
        assert after - ended >= SWEEP_SPACING * (ended - began) * 0.99, spans


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_a_subscriber_keeps_taking_messages_behind_a_held_snapshot(
    broker: Broker
) -> None:
    """End to end: messages published, handled and archived while another session holds a
    snapshot open (their dead entries stay), then a late publish and a lock released; every
    message is handled once."""
    quick_floors(broker)
    handled: list[str] = []

    @broker.subscriber("jobs", flush_interval=0.01)
    async def handle(msg: Message) -> None:
        handled.append(msg.body)

    async with broker.db.connect() as holder, broker.db.connect() as late:
        await holder.execute(text("BEGIN ISOLATION LEVEL REPEATABLE READ"))
        await holder.execute(text("SELECT 1"))
        await late.begin()
        await late.execute(text("SELECT 1"))
        await broker.start()
        for n in range(20):
            await broker.publish_batch("jobs", [f"m{n}-{k}" for k in range(50)])
            await asyncio.sleep(MARGIN / 4)
        await broker.publish("jobs", "late", connection=late)
        await late.commit()
        await wait_until(lambda: len(handled) == 1001, message="1,001 messages handled")
        await holder.rollback()
    await broker.stop()
    assert sorted(handled) == sorted([f"m{n}-{k}" for n in range(20) for k in range(50)]
                                     + ["late"])
