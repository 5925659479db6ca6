"""Publishing: delayed delivery, delivery order, the transactional outbox (async and sync,
connection and session) and batches."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqlmq import Broker, Message, PublishError
from sqlmq.connect import parse_url, sync_url

from .conftest import counting_inserts, drained, on_every_engine, rows, speed_up, wait_until

FAST = {"flush_interval": 0.01, "max_fetch_interval": 0.02}
CLOCK_RESOLUTION = timedelta(milliseconds=2)  # SQLite keeps milliseconds


async def consume(broker: Broker, queue: str, count: int, **options: Any) -> list[Any]:
    """Subscribe to ``queue`` with one worker, run until ``count`` messages were handled
    and the queue is empty, and return the bodies in the order they were handled."""
    handled: list[Any] = []

    @broker.subscriber(queue, workers=1, **{**FAST, **options})
    async def handle(msg: Message) -> None:
        handled.append(msg.body)

    await broker.start()
    try:
        await wait_until(lambda: len(handled) >= count, message=f"{count} handled")
        await wait_until(lambda: drained(broker, queue), message="queue drained")
    finally:
        await broker.stop()
    return handled


@pytest.fixture
def sync_engine(db_url: str) -> Iterator[SyncEngine]:
    """The caller's own synchronous engine on the same database (the same file for
    SQLite), as an application using publish_sync would have it."""
    engine = create_engine(sync_url(parse_url(db_url)))
    yield engine
    engine.dispose()


# ---- delayed delivery and order ------------------------------------------------------------


@on_every_engine
async def test_delayed_message_stays_pending_until_due(broker: Broker) -> None:
    speed_up(broker)  # on the in-memory engine, delays pass 10 times faster
    msg_id = await broker.publish("q", "later", delay=1.0)
    (row,) = await rows(broker, id=msg_id)

    assert row["state"] == "PENDING"
    assert row["deliveries_count"] == 0
    assert abs(row["next_attempt_at"] - row["created_at"] - timedelta(seconds=1)) <= (
        CLOCK_RESOLUTION
    )

    assert await consume(broker, "q", 1) == ["later"]
    (done,) = await rows(broker, "archive", id=msg_id)
    assert done["first_attempt_at"] >= row["next_attempt_at"]  # not delivered before due


@on_every_engine
async def test_message_published_at_a_time_is_due_exactly_then(broker: Broker) -> None:
    speed_up(broker)  # on the in-memory engine, delays pass 10 times faster
    now = await broker.engine.now()
    at = (now + timedelta(seconds=0.5)).astimezone(timezone(timedelta(hours=2)))
    msg_id = await broker.publish("q", "at", at=at)
    (row,) = await rows(broker, id=msg_id)

    assert row["state"] == "PENDING"
    assert row["next_attempt_at"] == at  # the same instant, whatever zone it was given in
    assert await consume(broker, "q", 1) == ["at"]
    (done,) = await rows(broker, "archive", id=msg_id)
    assert done["first_attempt_at"] >= at


@on_every_engine
async def test_delayed_messages_are_handled_in_due_order_not_publish_order(
    broker: Broker,
) -> None:
    speed_up(broker)  # on the in-memory engine, delays pass 10 times faster
    await broker.publish("q", "third", delay=1.0)
    await broker.publish("q", "second", delay=0.5)
    await broker.publish("q", "first")

    assert await consume(broker, "q", 3) == ["first", "second", "third"]


@on_every_engine
async def test_one_worker_handles_in_next_attempt_at_then_id_order(broker: Broker) -> None:
    speed_up(broker)  # on the in-memory engine, delays pass 10 times faster
    now = await broker.engine.now()
    at = lambda seconds: now + timedelta(seconds=seconds)  # noqa: E731
    # Published out of schedule order; equal schedules are broken by id.
    await broker.publish("q", "late", at=at(0.8))
    await broker.publish("q", "past-2a", at=at(-2))
    await broker.publish_batch("q", ["now-a", "now-b", "now-c"])
    await broker.publish("q", "past-5", at=at(-5))
    await broker.publish("q", "soon", delay=0.2)
    await broker.publish_batch("q", ["past-3a", "past-3b"], at=at(-3))
    await broker.publish("q", "past-2b", at=at(-2))
    # "now-*" and "soon" are scheduled by the database clock when published; read back
    # their exact place rather than assume how fast publishing was.
    scheduled = sorted(await rows(broker), key=lambda r: (r["next_attempt_at"], r["id"]))
    expected = [r["payload"].decode() for r in scheduled]
    assert expected[:5] == ["past-5", "past-3a", "past-3b", "past-2a", "past-2b"]
    assert expected[5:8] == ["now-a", "now-b", "now-c"]
    assert set(expected[8:]) == {"soon", "late"}

    assert await consume(broker, "q", 10, fetch_batch=3) == expected


# ---- transactional publish (outbox) ------------------------------------------------------


def visible(engine: SyncEngine, broker: Broker) -> int:
    """Messages another connection can see. A plain read: on SQLite, sqlmq's own engine
    begins every transaction IMMEDIATE and would wait for the caller's to end."""
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(broker.schema.message)).scalar_one()


async def test_publish_on_an_async_connection_commits_and_rolls_back_with_it(
    broker: Broker, sync_engine: SyncEngine
) -> None:
    async with broker.db.begin() as conn:
        await broker.publish("q", "committed", connection=conn)
        assert visible(sync_engine, broker) == 0  # invisible to others until committed
    async with broker.db.connect() as conn:
        await conn.begin()
        await broker.publish_batch("q", ["rolled back", "also"], connection=conn)
        await conn.rollback()

    assert [r["payload"] for r in await rows(broker)] == [b"committed"]
    assert await consume(broker, "q", 1) == ["committed"]


async def test_publish_on_an_async_session_commits_and_rolls_back_with_it(
    broker: Broker, sync_engine: SyncEngine
) -> None:
    async with AsyncSession(broker.db) as session, session.begin():
        await broker.publish("q", "committed", connection=session)
        assert visible(sync_engine, broker) == 0
    async with AsyncSession(broker.db) as session:
        await session.begin()
        await broker.publish("q", "rolled back", connection=session)
        await session.rollback()

    assert [r["payload"] for r in await rows(broker)] == [b"committed"]
    assert await consume(broker, "q", 1) == ["committed"]


async def test_publish_sync_on_a_connection_commits_and_rolls_back_with_it(
    broker: Broker, sync_engine: SyncEngine
) -> None:
    with sync_engine.begin() as conn:
        broker.publish_sync("q", "committed", connection=conn)
        assert visible(sync_engine, broker) == 0
    with sync_engine.connect() as conn:
        broker.publish_batch_sync("q", ["rolled back", "also"], connection=conn)
        conn.rollback()

    assert [r["payload"] for r in await rows(broker)] == [b"committed"]
    assert await consume(broker, "q", 1) == ["committed"]


async def test_publish_sync_on_a_session_commits_and_rolls_back_with_it(
    broker: Broker, sync_engine: SyncEngine
) -> None:
    with Session(sync_engine) as session, session.begin():
        broker.publish_sync("q", "committed", connection=session)
    with Session(sync_engine) as session:
        broker.publish_sync("q", "rolled back", connection=session)
        session.rollback()

    assert [r["payload"] for r in await rows(broker)] == [b"committed"]
    assert await consume(broker, "q", 1) == ["committed"]


@on_every_engine
async def test_publish_sync_without_a_connection_commits_on_its_own(broker: Broker) -> None:
    msg_id = await asyncio.to_thread(broker.publish_sync, "q", {"n": 1})

    assert [r["id"] for r in await rows(broker)] == [msg_id]
    assert await consume(broker, "q", 1) == [{"n": 1}]


async def test_publish_refuses_a_connection_of_the_other_kind(
    broker: Broker, sync_engine: SyncEngine
) -> None:
    with sync_engine.connect() as conn, pytest.raises(PublishError, match="publish_sync"):
        await broker.publish("q", "x", connection=conn)  # type: ignore[arg-type]
    async with broker.db.connect() as conn:
        with pytest.raises(PublishError, match="await publish"):
            broker.publish_sync("q", "x", connection=conn)  # type: ignore[arg-type]
    assert await rows(broker) == []


# ---- batches -------------------------------------------------------------------------------


async def test_publish_batch_returns_ids_in_body_order_in_one_round_trip(
    broker: Broker,
) -> None:
    bodies = [{"n": n} for n in range(50)]
    with counting_inserts(broker.db.sync_engine) as inserts:
        ids = await broker.publish_batch("q", bodies, headers={"batch": "1"})

    assert len(inserts) == 1
    assert len(ids) == 50 and ids == sorted(ids) and len(set(ids)) == 50
    by_id = {r["id"]: r for r in await rows(broker)}
    assert [by_id[i]["payload"] for i in ids] == [f'{{"n":{n}}}'.encode() for n in range(50)]
    assert all(by_id[i]["headers"]["batch"] == "1" for i in ids)


async def test_publish_batch_sync_returns_ids_in_body_order_in_one_round_trip(
    broker: Broker, sync_engine: SyncEngine
) -> None:
    with counting_inserts(sync_engine) as inserts, sync_engine.begin() as conn:
        ids = broker.publish_batch_sync("q", [str(n) for n in range(50)], connection=conn)

    assert len(inserts) == 1
    by_id = {r["id"]: r for r in await rows(broker)}
    assert [by_id[i]["payload"] for i in ids] == [str(n).encode() for n in range(50)]


@on_every_engine
async def test_a_batch_takes_headers_per_message(broker: Broker) -> None:
    """A sequence of mappings gives each message its own headers, over the content type its
    body was given (a ``content-type`` of its own wins), in 1 statement under 200 messages
    and over them (PostgreSQL's COPY); a single publish and a topic publish still take one
    mapping, and a count that does not match the bodies writes nothing."""
    for n in (3, 250):
        each = [{"i": str(i)} for i in range(n)]
        each[1] = {"i": "1", "content-type": "application/json"}
        ids = await broker.publish_batch(f"each{n}", [b"{}"] * n, headers=each)
        by_id = {r["id"]: r for r in await rows(broker, queue=f"each{n}")}
        assert [by_id[i]["headers"]["i"] for i in ids] == [str(i) for i in range(n)]
        assert [by_id[i]["headers"]["content-type"] for i in ids[:3]] == [
            "application/octet-stream", "application/json", "application/octet-stream"]
    for bad, fragment in [
        (lambda: broker.publish_batch("q", [b"a", b"b"], headers=[{"i": "0"}]),
         "headers has 1 mappings for 2 messages"),
        (lambda: broker.publish_batch("q", [b"a"], headers=[{"n": 1}]),
         "header 'n' must be a string"),
        (lambda: broker.publish("q", b"a", headers=[{"i": "0"}]),
         "headers must be a mapping of str to str, got list"),
        (lambda: broker.publish_topic("t", b"a", headers=[{"i": "0"}]),
         "headers must be a mapping of str to str, got list"),
    ]:
        with pytest.raises(PublishError, match=fragment):
            await bad()
    assert await rows(broker, queue="q") == []


@on_every_engine
async def test_empty_batch_writes_nothing(broker: Broker) -> None:
    assert await broker.publish_batch("q", []) == []
    assert await rows(broker) == []


async def test_a_batch_larger_than_a_statement_lands_whole_and_in_order(broker: Broker) -> None:
    """12,001 bodies of three content types, with every byte value, quotes, backslashes,
    percent signs and NULs: more rows than one INSERT carries (MariaDB's batch path splits at
    5,000), ids in body order, every payload and headers set back as sent."""
    tricky = bytes(range(256)) + b"'\"\\%s%%\x00"
    bodies: list[Any] = []
    for n in range(12_001):
        bodies.append([tricky + n.to_bytes(4, "big"), f"t{n}'\\%", {"n": n}][n % 3])
    ids = await broker.publish_batch("q", bodies, headers={"h": "it's"})
    assert len(ids) == 12_001 and ids == sorted(ids)
    by_id = {r["id"]: r for r in await rows(broker)}
    for n, msg_id in enumerate(ids):
        row = by_id[msg_id]
        want = [tricky + n.to_bytes(4, "big"), f"t{n}'\\%".encode(),
                f'{{"n":{n}}}'.encode()][n % 3]
        assert row["payload"] == want and row["headers"]["h"] == "it's", n
    assert {by_id[i]["headers"]["content-type"] for i in ids[:3]} == {
        "application/octet-stream", "text/plain; charset=utf-8", "application/json"}


async def test_a_batch_of_large_payloads_and_a_scheduled_batch(broker: Broker) -> None:
    """Twelve payloads of 800 KB (more than one packet should carry: MariaDB's batch path
    sends its statements one at a time) land whole; a batch at a moment keeps it."""
    from datetime import UTC, datetime

    big = [bytes([n]) * 800_000 for n in range(12)]
    ids = await broker.publish_batch("q", big)
    by_id = {r["id"]: r for r in await rows(broker)}
    assert [by_id[i]["payload"] for i in ids] == big
    at = datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    later = await broker.publish_batch("later", [b"a", b"b"], at=at.astimezone(
        timezone(timedelta(hours=5))))
    by_id = {r["id"]: r for r in await rows(broker)}
    assert [by_id[i]["next_attempt_at"].astimezone(UTC) for i in later] == [at, at]
