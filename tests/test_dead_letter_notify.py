"""Dead letters on PostgreSQL send a NOTIFY on ``{prefix}dead_message``: one per message
archived FAILED or CANCELLED (or deleted so by a subscriber that keeps none), sent by the
statement that archives it, so delivered at its COMMIT, never on rollback and never for a
stale result; its payload is ``{"id", "queue", "state"}``. A raw asyncpg connection listens
here, as any program could; the engine's ``dead_letter_source`` is the same LISTEN behind
the contract (None on the other engines)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from sqlmq import Broker, Message, Outcome, Retry, Settlement
from sqlmq.dead_letters import DeadLetterNotice
from sqlmq.engines.postgresql.notify import DEAD_LETTER_PAYLOAD_MOST, NOTIFY_PAYLOAD_LIMIT
from sqlmq.schema import MAX_QUEUE_NAME

from .conftest import EVERY_ENGINE, PG_URL, rows, wait_until

postgresql = pytest.mark.parametrize("db_kind", ["postgresql"])

#: How long a test waits for a notification that must not come, after the commit.
QUIET = 0.5


class Heard:
    """The dead-letter notifications a connection of its own received, decoded."""

    def __init__(self) -> None:
        self.payloads: list[str] = []

    def __call__(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.append(payload)

    @property
    def items(self) -> list[dict[str, Any]]:
        return [json.loads(p) for p in self.payloads]

    def ids(self) -> list[int]:
        return [item["id"] for item in self.items]

    async def count(self, n: int) -> None:
        await wait_until(lambda: len(self.payloads) >= n, timeout=30,
                         message=f"{n} dead-letter notification(s), got {self.payloads}")
        await asyncio.sleep(QUIET)  # and no more
        assert len(self.payloads) == n, self.payloads


@pytest.fixture
async def heard(broker: Broker, prefix: str) -> AsyncIterator[Heard]:
    conn = await asyncpg.connect(PG_URL)
    got = Heard()
    await conn.add_listener(f"{prefix}dead_message", got)
    try:
        yield got
    finally:
        await conn.close()


async def _taken(broker: Broker, queue: str, n: int) -> list[Any]:
    await broker.publish_batch(queue, [{"n": i} for i in range(n)])
    taken = sorted(await broker.engine.acquire([queue], n, 30), key=lambda d: d.id)
    assert len(taken) == n
    return taken


@postgresql
async def test_a_runtime_failure_and_cancellations_notify_once_each(broker: Broker,
                                                                   heard: Heard) -> None:
    """A handler that raises under ``Retry.none()`` (FAILED), a cancel of a waiting message
    and a cancel of a running one (CANCELLED): one notification each, none for the
    messages completed alongside."""
    running = asyncio.Event()

    @broker.subscriber("jobs", retry=Retry.none(), max_fetch_interval=0.05,
                       flush_interval=0.01)
    async def handle(msg: Message) -> None:
        if msg.body["n"] == 1:
            raise ValueError("no")
        if msg.body["n"] == 2:
            running.set()
            while not msg.cancel_requested:
                await asyncio.sleep(0.01)
            raise RuntimeError("stopped: cancelled")

    waiting = await broker.publish("later", {"n": 9}, delay=3600)
    ids = [await broker.publish("jobs", {"n": n}) for n in range(4)]
    await broker.start()
    try:
        await asyncio.wait_for(running.wait(), 30)
        assert (await broker.cancel(waiting)).outcome == "cancelled"
        assert (await broker.cancel(ids[2])).outcome == "requested"
        await heard.count(3)
    finally:
        await broker.stop()
    by_id = {item["id"]: item for item in heard.items}
    assert by_id == {
        ids[1]: {"id": ids[1], "queue": "jobs", "state": "FAILED"},
        waiting: {"id": waiting, "queue": "later", "state": "CANCELLED"},
        ids[2]: {"id": ids[2], "queue": "jobs", "state": "CANCELLED"},
    }
    archived = {r["id"]: r["state"] for r in await rows(broker, "archive")}
    assert archived == {ids[0]: "COMPLETED", ids[1]: "FAILED", ids[2]: "CANCELLED",
                        ids[3]: "COMPLETED", waiting: "CANCELLED"}


@postgresql
async def test_settle_notifies_only_the_dead_results_that_land(broker: Broker,
                                                               heard: Heard) -> None:
    """One batch of every kind: completed, retried, released, expired and a stale FAIL send
    nothing; a FAIL kept and a FAIL deleted (``keep=False``: a subscriber's ``archive=``)
    are dead letters both; a CANCEL, in the same transaction, too."""
    a, b, c, d, e, f, g, h = await _taken(broker, "q", 8)
    written = await broker.engine.settle([
        Settlement(a.id, a.deliveries, Outcome.COMPLETE),
        Settlement(b.id, b.deliveries, Outcome.FAIL, error="kept"),
        Settlement(c.id, c.deliveries, Outcome.FAIL, error="deleted", keep=False),
        Settlement(d.id, d.deliveries, Outcome.RETRY, delay=60),
        Settlement(e.id, e.deliveries, Outcome.RELEASE),
        Settlement(f.id, f.deliveries, Outcome.EXPIRE),
        Settlement(g.id, g.deliveries + 1, Outcome.FAIL, error="stale"),
        Settlement(h.id, h.deliveries, Outcome.CANCEL, error="cancelled"),
    ])
    assert written == {a.id, b.id, c.id, d.id, e.id, f.id, h.id}
    await heard.count(3)
    assert sorted(heard.ids()) == [b.id, c.id, h.id]
    assert {i["id"]: i["state"] for i in heard.items} == {b.id: "FAILED", c.id: "FAILED",
                                                          h.id: "CANCELLED"}

    # The stale FAIL and a stale CANCEL of the same message write nothing, and say nothing.
    assert await broker.engine.settle([
        Settlement(g.id, g.deliveries + 1, Outcome.FAIL, error="stale"),
        Settlement(g.id, g.deliveries - 1, Outcome.CANCEL),
    ]) == set()
    await heard.count(3)
    # A batch of nothing but completions notifies nothing.
    done = await _taken(broker, "q", 50)
    assert len(await broker.engine.settle(
        [Settlement(x.id, x.deliveries, Outcome.COMPLETE) for x in done])) == 50
    await heard.count(3)


@postgresql
async def test_a_rolled_back_settle_or_cancel_notifies_nothing(broker: Broker,
                                                               heard: Heard) -> None:
    """The NOTIFY is part of the archiving transaction: rolled back, it is never sent;
    the same statements committed send it."""
    engine: Any = broker.engine
    failed, cancelled = await _taken(broker, "q", 2)
    waiting = await broker.publish("q", {"waits": True}, delay=3600)
    batch = [Settlement(failed.id, failed.deliveries, Outcome.FAIL, error="x"),
             Settlement(cancelled.id, cancelled.deliveries, Outcome.CANCEL)]
    async with broker.db.connect() as conn:
        transaction = await conn.begin()
        assert await engine._settle_onward(conn, batch) == {failed.id, cancelled.id}
        await engine._archive_cancelled(conn, waiting, None, None)
        await transaction.rollback()
    await heard.count(0)
    assert {r["state"] for r in await rows(broker, "message")} == {"PROCESSING", "PENDING"}

    assert await broker.engine.settle(batch) == {failed.id, cancelled.id}
    assert (await broker.cancel(waiting)).outcome == "cancelled"
    await heard.count(3)
    assert sorted(heard.ids()) == sorted([failed.id, cancelled.id, waiting])


@postgresql
async def test_the_payload_fits_whatever_the_queue_name(broker: Broker, heard: Heard) -> None:
    """A queue name of MAX_QUEUE_NAME control characters (each written ``\\u00XX``, the
    longest JSON there is) still fits PostgreSQL's 8000 bytes, with room to spare."""
    assert DEAD_LETTER_PAYLOAD_MOST < NOTIFY_PAYLOAD_LIMIT
    queue = "\x01" * MAX_QUEUE_NAME
    (d,) = await _taken(broker, queue, 1)
    assert await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL)]) == {d.id}
    waiting = await broker.publish(queue, {"n": 2}, delay=3600)
    assert (await broker.cancel(waiting)).outcome == "cancelled"
    await heard.count(2)
    assert [(i["queue"], i["state"]) for i in heard.items] == [(queue, "FAILED"),
                                                               (queue, "CANCELLED")]
    assert max(len(p.encode()) for p in heard.payloads) <= DEAD_LETTER_PAYLOAD_MOST


@pytest.mark.parametrize("db_kind", EVERY_ENGINE)
async def test_only_postgresql_has_a_dead_letter_source(broker: Broker, db_kind: str) -> None:
    source = broker.engine.dead_letter_source(lambda notice: None, lambda: None)
    assert (source is not None) == (db_kind == "postgresql")
    if source is not None:
        assert source.channel == f"{broker.schema.prefix}dead_message"


@postgresql
async def test_the_dead_letter_source_reconnects_and_says_so(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine's source delivers each notice, calls ``on_connect`` after every
    (re)connect, and survives its connection being killed, with a log line."""
    notices: list[DeadLetterNotice] = []
    connects: list[int] = []
    source: Any = broker.engine.dead_letter_source(notices.append,
                                                   lambda: connects.append(1))
    caplog.set_level(logging.WARNING, logger="sqlmq")
    source.start()
    try:
        await wait_until(lambda: len(connects) == 1, message="the first connect")
        (d,) = await _taken(broker, "jobs", 1)
        await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL)])
        await wait_until(lambda: notices == [DeadLetterNotice(d.id, "jobs", "FAILED")])

        killer = await asyncpg.connect(PG_URL)
        try:
            assert await killer.fetchval("SELECT pg_terminate_backend($1)", source.backend_pid)
        finally:
            await killer.close()
        await wait_until(lambda: len(connects) == 2, timeout=30, message="a reconnect")
        waiting = await broker.publish("later", {"n": 1}, delay=3600)
        await broker.cancel(waiting)
        await wait_until(lambda: len(notices) == 2)
        assert notices[1] == DeadLetterNotice(waiting, "later", "CANCELLED")
    finally:
        await source.stop()
    said = [r.getMessage() for r in caplog.records]
    assert any("dead_message" in line and "failed" in line for line in said), said
