"""Connection loss mid-run: the database drops the subscriber's connections while it drains
a queue; the loops log it, retry with backoff and resume, and every message ends up
archived exactly once.

PostgreSQL: ``pg_terminate_backend`` on the backends carrying this test's
``application_name`` (set in the URL). MariaDB: ``KILL CONNECTION`` on the connections of a
MariaDB user created for this test only. Other people's tests share both servers, so nothing
else is touched. SQLite has no server connection to drop: another connection holds the file's
write lock (``BEGIN EXCLUSIVE``) for seconds at a time, which stalls every write.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from sqlalchemy import func, make_url, select, text

from sqlmq import Broker, Message

from .conftest import rows, wait_until

MESSAGES = 2000
ROUNDS = 3


async def archived(observer: Broker) -> int:
    a = observer.schema.archive
    async with observer.db.connect() as conn:
        return (await conn.execute(select(func.count()).select_from(a))).scalar_one()


@asynccontextmanager
async def victim_broker(
    kind: str, url: str, prefix: str, observer: Broker
) -> AsyncIterator[tuple[Broker, Callable[[], Awaitable[int]]]]:
    """A broker whose connections can be told apart from everyone else's, and a coroutine
    that drops them all (returning how many it dropped)."""
    tag = f"sqlmq_{prefix}"[:60]
    if kind == "postgresql":
        async def drop() -> int:
            async with observer.db.connect() as conn:
                return len((await conn.execute(text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND application_name = :tag"), {"tag": tag})).all())

        b = Broker(make_url(url).update_query_dict({"application_name": tag}),
                   table_prefix=prefix, recovery_interval=0.5)
        try:
            yield b, drop
        finally:
            await b.close()
    elif kind == "mariadb":
        database = make_url(url).database
        async with observer.db.begin() as conn:
            await conn.execute(text(f"CREATE USER '{tag}'@'%'"))
            await conn.execute(text(f"GRANT ALL ON `{database}`.* TO '{tag}'@'%'"))

        async def drop() -> int:
            async with observer.db.connect() as conn:
                ids = (await conn.execute(text(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = :tag"),
                    {"tag": tag})).scalars().all()
                for conn_id in ids:
                    try:
                        await conn.execute(text(f"KILL CONNECTION {int(conn_id)}"))
                    except Exception:  # it ended by itself meanwhile
                        pass
                return len(ids)

        b = Broker(make_url(url).set(username=tag, password=None), table_prefix=prefix,
                   recovery_interval=0.5)
        try:
            yield b, drop
        finally:
            await b.close()
            async with observer.db.begin() as conn:
                await conn.execute(text(f"DROP USER IF EXISTS '{tag}'@'%'"))
    else:
        path = make_url(url).database

        async def drop() -> int:
            await asyncio.to_thread(_hold_write_lock, path, 2.0)
            return 1

        b = Broker(url, table_prefix=prefix, recovery_interval=0.5)
        try:
            yield b, drop
        finally:
            await b.close()


def _hold_write_lock(path: str, seconds: float) -> None:
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        time.sleep(seconds)
        conn.execute("COMMIT")
    finally:
        conn.close()


async def test_subscriber_survives_losing_its_database_connections_mid_run(
    broker: Broker, db_kind: str, db_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sqlmq")
    handled: list[int] = []
    published = await broker.publish_batch("drain", range(MESSAGES))

    async with victim_broker(db_kind, db_url, prefix, broker) as (worker, drop):

        # A short lease: an acquire whose answer was lost with its connection leaves rows
        # PROCESSING that nobody holds; they come back after the lease, not after 30s.
        @worker.subscriber("drain", workers=4, lease=3.0, flush_interval=0.02)
        async def handle(msg: Message) -> None:
            await asyncio.sleep(0.01)  # 4 workers: the drain takes 5s at the very least
            handled.append(msg.id)

        await worker.start()
        try:
            progress = 100
            for _ in range(ROUNDS):
                await wait_until(lambda n=progress: _at_least(broker, n), timeout=120,  # type: ignore[misc]
                                 interval=0.01, message=f"{progress} messages archived")
                before = await archived(broker)
                assert before < MESSAGES, "the queue drained before the connections were lost"
                if db_kind == "sqlite":
                    await drop()
                else:
                    await _drop_until_noticed(drop, caplog)
                progress = await archived(broker) + 100
            await wait_until(lambda: _at_least(broker, MESSAGES), timeout=120, interval=0.1,
                             message="every message archived")
        finally:
            await worker.stop()

    assert set(handled) == set(published)
    archive: list[Any] = await rows(broker, "archive")
    assert sorted(r["id"] for r in archive) == sorted(published)
    assert {r["state"] for r in archive} == {"COMPLETED"}
    assert await rows(broker, "message") == []
    if db_kind != "sqlite":
        messages = [r.getMessage() for r in caplog.records if r.name == "sqlmq"]
        assert any("retrying with backoff" in m for m in messages), messages
        assert any("recovered after" in m for m in messages), messages


async def _drop_until_noticed(
    drop: Callable[[], Awaitable[int]], caplog: pytest.LogCaptureFixture
) -> None:
    """Drop the connections again and again until a loop of the subscriber has hit a dead
    one (an idle pooled connection is replaced silently by the pre-ping)."""
    seen = sum("retrying with backoff" in r.getMessage() for r in caplog.records)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while sum("retrying with backoff" in r.getMessage() for r in caplog.records) == seen:
        assert loop.time() < deadline, "no loop noticed the dropped connections"
        await drop()
        await asyncio.sleep(0.02)


async def _at_least(observer: Broker, n: int) -> bool:
    return await archived(observer) >= n
