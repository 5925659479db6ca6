"""SQLite, several connections (as several processes have): a writer whose ``BEGIN
IMMEDIATE`` is refused tries again itself every millisecond or two instead of sleeping up
to 100 ms in SQLite's busy handler (``sqlmq/engines/sqlite/connections.py``), gives up after the
busy timeout with an error that says so, and leaves its connection's busy timeout as it
found it. The process-level consequence (no worker process starved of a shared queue) is in
``test_work_sharing.py``."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from sqlmq import Broker
from sqlmq.engines.sqlite import connections as sqlite_connections
from sqlmq.engines.sqlite.engine import _NO_BUSY_WAIT


def _holder(path: Path) -> sqlite3.Connection:
    """Another connection to the file, holding its write lock."""
    holder = sqlite3.connect(path, isolation_level=None, timeout=0)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def _busy_timeout(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA busy_timeout").fetchone()[0])


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_writer_kept_waiting_by_another_connection_gets_in_once_it_commits(
    broker: Broker, db_url: str,
) -> None:
    holder = _holder(Path(db_url.removeprefix("sqlite:///")))
    try:
        async def write() -> int:
            async with broker.db.begin() as conn:
                timeout = (await conn.execute(text("PRAGMA busy_timeout"))).scalar_one()
                await broker.publish("jobs", "waited", connection=conn)
                return int(timeout)

        writer = asyncio.create_task(write())
        await asyncio.sleep(0.3)
        assert not writer.done(), "the write lock was not held: the test proves nothing"
    finally:
        holder.commit()
        holder.close()
    assert await asyncio.wait_for(writer, 10) == 60_000
    assert [s.pending for s in await broker.stats() if s.queue == "jobs"] == [1]


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_single_publish_kept_waiting_gets_in_once_the_lock_is_free(
    broker: Broker, db_url: str,
) -> None:
    """A single publish is one statement committing by itself on a kept connection whose
    busy handler is off: refused, it is tried again, and the message is written once."""
    await broker.publish("jobs", "first")  # the kept connection, its busy handler off
    holder = _holder(Path(db_url.removeprefix("sqlite:///")))
    try:
        writer = asyncio.create_task(broker.publish("jobs", "waited"))
        await asyncio.sleep(0.3)
        assert not writer.done(), "the write lock was not held: the test proves nothing"
    finally:
        holder.commit()
        holder.close()
    await asyncio.wait_for(writer, 10)
    assert [s.pending for s in await broker.stats() if s.queue == "jobs"] == [2]


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_single_publish_gives_up_after_the_busy_timeout_having_written_nothing(
    broker: Broker, db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sqlite_connections, "_BUSY_TIMEOUT", 0.3)
    holder = _holder(Path(db_url.removeprefix("sqlite:///")))
    try:
        with pytest.raises(OperationalError, match="held the write lock for over 0 s"):
            await broker.publish("jobs", "refused")
    finally:
        holder.rollback()
        holder.close()
    assert [s.pending for s in await broker.stats() if s.queue == "jobs"] in ([], [0])


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_an_acquire_after_one_that_found_nothing_looks_without_the_write_lock(
    broker: Broker, db_url: str,
) -> None:
    """Once a plain acquire found nothing ready, the next looks first as a reader, which
    no writer holds up: a queue of channel messages only made every other acquire's plain
    part wait for the lock behind the settles, to learn that nothing was there. What is
    published meanwhile is found by the acquire after (taking it needs the lock)."""
    engine: Any = broker.engine
    assert await engine._acquire_plain(["jobs"], 10, 30) == []  # under the write lock
    holder = _holder(Path(db_url.removeprefix("sqlite:///")))
    try:
        assert await asyncio.wait_for(engine._acquire_plain(["jobs"], 10, 30), 1) == []
        waiting = asyncio.create_task(broker.publish("jobs", "after"))
        await asyncio.sleep(0.2)
        assert not waiting.done(), "the write lock was not held: the test proves nothing"
    finally:
        holder.commit()
        holder.close()
    await asyncio.wait_for(waiting, 10)
    (got,) = await engine._acquire_plain(["jobs"], 10, 30)
    assert got.id == waiting.result()
    assert await engine._acquire_plain(["jobs"], 10, 30) == []


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_an_acquire_whose_look_as_a_reader_is_refused_takes_the_write_lock_to_know(
    broker: Broker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader is refused only rarely (another connection recovering the log); the look
    then counts as "maybe": the acquire takes the write lock and finds what is there,
    instead of failing."""
    from sqlmq.engines.sqlite import engine as sqlite_engine

    engine: Any = broker.engine
    assert await engine._acquire_plain(["jobs"], 10, 30) == []
    sent = await broker.publish("jobs", "after")
    fetch, refusals = sqlite_engine.fetch, []

    async def refused_once(conn: Any, sql: str, params: Any) -> list[Any]:
        if not refusals:
            refusals.append(sql)
            raise sqlite3.OperationalError("database is locked")
        return await fetch(conn, sql, params)

    monkeypatch.setattr(sqlite_engine, "fetch", refused_once)
    (got,) = await engine._acquire_plain(["jobs"], 10, 30)
    assert got.id == sent and len(refusals) == 1


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_kept_connections_go_back_to_the_pool_with_the_busy_handler_on(
    broker: Broker,
) -> None:
    engine = broker.engine
    await asyncio.gather(*(broker.publish("jobs", str(i)) for i in range(3)))
    kept = [conn for conn, _ in engine._kept]  # type: ignore[attr-defined]
    assert kept and all(conn.info.get(_NO_BUSY_WAIT) for conn in kept)
    raws = [(await conn.get_raw_connection()).driver_connection for conn in kept]
    await engine._return_kept()  # type: ignore[attr-defined]
    for raw in raws:
        ((timeout,),) = await raw.execute_fetchall("PRAGMA busy_timeout")
        assert timeout == 60_000


def test_a_writer_gives_up_after_the_busy_timeout_naming_why_and_restores_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sqlite_connections, "_BUSY_TIMEOUT", 0.3)
    path = tmp_path / "locked.db"
    waiter = sqlite3.connect(path, isolation_level=None)
    waiter.execute("PRAGMA journal_mode=WAL")
    waiter.execute("PRAGMA busy_timeout=60000")
    holder = _holder(path)
    try:
        with pytest.raises(OperationalError, match="another process held the write lock "
                                                   "for over 0 s") as refused:
            sqlite_connections._begin_immediate(waiter, is_async=False)
        assert refused.value.statement == "BEGIN IMMEDIATE"
        assert not waiter.in_transaction
        assert _busy_timeout(waiter) == 60_000
    finally:
        holder.rollback()
        holder.close()
    sqlite_connections._begin_immediate(waiter, is_async=False)
    assert waiter.in_transaction
    assert _busy_timeout(waiter) == 60_000
    waiter.rollback()
    waiter.close()


def test_an_error_other_than_busy_is_raised_at_once(tmp_path: Path) -> None:
    waiter = sqlite3.connect(tmp_path / "open.db", isolation_level=None)
    waiter.execute("BEGIN")  # a transaction open already: BEGIN IMMEDIATE is refused
    with pytest.raises(OperationalError, match="within a transaction"):
        sqlite_connections._begin_immediate(waiter, is_async=False)
    waiter.rollback()
    assert _busy_timeout(waiter) == 60_000
    waiter.close()
