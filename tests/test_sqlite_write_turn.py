"""SQLite, one process: the engine's writers take turns on an asyncio lock instead of
sleeping in SQLite's busy handler (``sqlmq/engines/sqlite/connections.py``). A turn ends with its
transaction, not with its connection, so a connection kept open between transactions holds
nobody up."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from sqlalchemy import text

from sqlmq import Broker, Message

from .conftest import wait_until


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_connection_kept_open_after_its_commit_does_not_hold_back_the_worker(
    broker: Broker,
) -> None:
    handled: list[str] = []

    @broker.subscriber("jobs", max_fetch_interval=0.05)
    async def handle(msg: Message) -> None:
        handled.append(msg.body)

    await broker.start()
    try:
        async with broker.db.connect() as conn:
            await broker.publish("jobs", "in the outbox", connection=conn)
            await conn.commit()
            # The connection stays checked out; the worker must still acquire and settle.
            await broker.publish("jobs", "on its own")
            await wait_until(lambda: len(handled) == 2, timeout=10, message="both handled")
    finally:
        await broker.stop()
    assert sorted(handled) == ["in the outbox", "on its own"]


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_concurrent_writers_of_one_broker_all_get_their_turn(broker: Broker) -> None:
    ids = await asyncio.gather(*(broker.publish("jobs", f"m{i}") for i in range(200)))
    assert sorted(ids) == sorted(set(ids))
    assert len(ids) == 200


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_task_cancelled_inside_a_statement_ends_cancelled_and_frees_the_write_lock(
    broker: Broker,
) -> None:
    """SQLAlchemy invalidates a connection whose statement a cancellation cut short; the
    turn's end then must not read the connection, which raised PendingRollbackError in
    place of the CancelledError (the task's stopper took it for an ordinary failure)."""
    started = asyncio.Event()

    async def slow() -> None:
        async with broker.db.begin() as conn:
            started.set()
            await conn.execute(text(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                "WHERE x < 2000000) SELECT count(*) FROM c"))

    task = asyncio.create_task(slow())
    await started.wait()
    await asyncio.sleep(0.1)  # inside the statement, which takes about a second
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    from sqlmq.engines.sqlite.connections import _TURN

    assert not any(lock.locked() for lock in broker.db.sync_engine.__dict__[_TURN].values())
    # The database's own write lock is free as well: the cut-short transaction was rolled
    # back, not left to a zombie connection until the garbage collector found its cursor.
    await asyncio.to_thread(_take_write_lock, broker.db.url.database)


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_task_cancelled_between_a_statements_first_row_and_the_rest_frees_the_write_lock(
    broker: Broker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The statement has run and holds its first row when the cancellation lands (its cursor
    is kept alive by the traceback). ``sqlite3_interrupt`` then would set a flag that SQLite
    clears only once no statement is active, so the rollback itself was interrupted and the
    connection closed as a zombie that held the write lock until its cursor was collected."""
    import aiosqlite

    reached = asyncio.Event()

    async def stalled(self: aiosqlite.Cursor) -> list[object]:
        reached.set()
        await asyncio.Event().wait()
        return []

    async def fetch() -> None:
        async with broker.db.begin() as conn:
            await conn.execute(text("SELECT 1 UNION ALL SELECT 2"))

    monkeypatch.setattr(aiosqlite.Cursor, "fetchall", stalled)
    task = asyncio.create_task(fetch())
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    monkeypatch.undo()
    await asyncio.to_thread(_take_write_lock, broker.db.url.database)


def _take_write_lock(path: str | None) -> None:
    assert path
    other = sqlite3.connect(path, timeout=5, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_the_pool_rolls_back_only_a_connection_it_takes_back_in_a_transaction(
    broker: Broker, db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool's reset on return is SQLite's own (``_roll_back_if_open``): a committed
    transaction's connection goes back without the rollback the pool sent after every
    transaction (a trip to aiosqlite's thread each); one given back in a transaction is
    rolled back, its write undone and the write lock freed."""
    import aiosqlite

    from sqlmq.engines.sql.kept_connections import driver_connection

    rollbacks: list[int] = []
    rollback = aiosqlite.Connection.rollback

    async def counted(self: aiosqlite.Connection) -> None:
        rollbacks.append(1)
        await rollback(self)

    monkeypatch.setattr(aiosqlite.Connection, "rollback", counted)
    for _ in range(3):
        async with broker.db.begin() as conn:
            await broker.publish("jobs", "committed", connection=conn)
    assert rollbacks == []
    async with broker.db.connect() as conn:  # a transaction the caller never ends
        raw = await driver_connection(conn)
        await raw.execute("BEGIN IMMEDIATE")
        await raw.execute(f"DELETE FROM {broker.schema.message.name}")
    assert rollbacks == [1]
    other = sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=0,
                            isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # the write lock is free
        other.rollback()
    finally:
        other.close()
    assert [s.pending for s in await broker.stats() if s.queue == "jobs"] == [3]
