"""The contract suite's engines: every scenario runs on the in-memory engine, SQLite,
PostgreSQL and MariaDB, through the methods of ``sqlmq.engines.contract.Engine`` only.

Time: :meth:`Env.passes` moves the in-memory engine's clock at once and, on a database,
waits until the database clock (``engine.now()``) has moved that far. Scenarios keep their
leases and delays to a few tenths of a second so a database run stays short.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine as SyncDb
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sqlmq import Broker, build_schema
from sqlmq.engines.contract import Engine
from sqlmq.engines.memory.engine import MemoryEngine
from sqlmq.records import Delivery, NewMessage, NewMessages, QueueStats

from ..conftest import drop_tables, url_for

ENGINES = ["memory", "sqlite", "postgresql", "mariadb"]
#: The engines that hand a publish straight to an idle subscriber of the process (PostgreSQL
#: does not: its NOTIFY wakes subscribers at once, and an acquire takes it from there).
HANDING_OVER = ["memory", "sqlite", "mariadb"]


@dataclass
class Env:
    """One engine under test, and what a scenario needs around it."""

    kind: str
    engine: Engine
    #: A database of the caller's own for outbox publishes: sqlmq's database for the SQL
    #: engines, an in-memory SQLite database for the memory engine.
    outbox_db: AsyncEngine
    outbox_sync_db: SyncDb

    async def passes(self, seconds: float) -> None:
        """Let ``seconds`` pass on the engine's clock."""
        if isinstance(self.engine, MemoryEngine):
            self.engine.advance(seconds)
            return
        until = await self.engine.now() + timedelta(seconds=seconds)
        while (left := (until - await self.engine.now()).total_seconds()) > 0:
            await asyncio.sleep(min(left + 0.005, 0.05))

    async def acquire_early(self, queue: str = "q") -> list[Delivery]:
        """Acquire where a scenario has just set a delay of a few tenths of a second and
        expects nothing yet, checking that nothing comes before its time.

        A loaded machine can take longer than the delay to get from the settle or publish
        to here, so what comes may be the message whose delay ran out meanwhile (CI saw
        this once in two thousand tests). The check is exact either way: each delivery was
        acquired at or after the moment it was due (``scheduled_at``, on the engine's own
        clock). On a quick run, and always on the memory engine, nothing comes; a scenario
        goes on with ``came or await engine.acquire(...)`` after :meth:`passes`.
        """
        came = await self.engine.acquire([queue], 10, 30)
        early = [(d.id, d.scheduled_at, d.acquired_at) for d in came
                 if d.scheduled_at is None or d.acquired_at < d.scheduled_at]
        assert early == [], f"acquired before they were due: {early}"
        return came

    async def publish(self, queue: str = "q", *payloads: bytes, delay: float = 0.0,
                      at: datetime | None = None,
                      headers: dict[str, str] | None = None) -> list[int]:
        """Publish ``payloads`` (one ``b"m"`` by default) through ``engine.publish``."""
        return await self.engine.publish(
            NewMessages.of([msg(queue, p, delay=delay, at=at, headers=headers)
                            for p in payloads or [b"m"]]))

    async def stats(self, queue: str = "q") -> QueueStats:
        for s in await self.engine.stats():
            if s.queue == queue:
                return s
        return QueueStats(queue, 0, 0, 0, 0, 0, None)


def msg(queue: str = "q", payload: bytes = b"m", *, delay: float = 0.0,
        at: datetime | None = None, headers: dict[str, str] | None = None) -> NewMessage:
    return NewMessage(queue, payload, dict(headers or {}), delay, at)


def ids(deliveries: Sequence[Any]) -> list[int]:
    return [d.id for d in deliveries]


@pytest.fixture(params=ENGINES)
async def env(request: pytest.FixtureRequest, tmp_path: Any, prefix: str) -> AsyncIterator[Env]:
    kind = request.param
    if kind == "memory":
        outbox_db = create_async_engine("sqlite+aiosqlite://")
        outbox_sync_db = create_engine("sqlite://")
        try:
            yield Env(kind, MemoryEngine(build_schema(prefix)), outbox_db, outbox_sync_db)
        finally:
            await outbox_db.dispose()
            outbox_sync_db.dispose()
        return
    url = url_for(kind, tmp_path)
    broker = Broker(url, table_prefix=prefix)
    await broker.migrate()
    try:
        yield Env(kind, broker.engine, broker.db, broker.sync_db)
    finally:
        await broker.close()
        drop_tables(url, prefix)


@pytest.fixture
def engine(env: Env) -> Engine:
    return env.engine
