"""The caller's own driver connections, as the outbox tests open and drive them: one async
face for asyncpg (alone or from a pool), psycopg (async and sync), PyMySQL, asyncmy,
sqlite3 and aiosqlite.

A sync driver's calls (its publishes included) run on one thread of their own: sqlite3's
connections belong to the thread that made them, and the test's event loop, where the
subscribers run, must not block on a lock the driver's transaction waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiosqlite
import asyncmy
import asyncpg
import psycopg
import pymysql
from sqlalchemy import make_url

from sqlmq import Broker

#: (database, driver) of every driver the outbox takes.
DRIVERS = [
    ("postgresql", "asyncpg"), ("postgresql", "asyncpg-pool"), ("postgresql", "psycopg-async"),
    ("postgresql", "psycopg"), ("mariadb", "pymysql"), ("mariadb", "asyncmy"),
    ("sqlite", "sqlite3"), ("sqlite", "aiosqlite"),
]
SYNC = {"psycopg", "pymysql", "sqlite3"}


def mysql_args(url: str) -> dict[str, Any]:
    u = make_url(url)
    return {"host": u.host, "port": u.port or 3306, "user": u.username,
            "password": u.password or "", "database": u.database}


class DriverConnection:
    """One open connection of ``driver``; ``options`` go to the driver's connect (e.g.
    ``autocommit=True``)."""

    def __init__(self, driver: str, url: str, **options: Any) -> None:
        self.driver = driver
        self.url = url
        self.options = options
        self.asynchronous = driver not in SYNC
        self.conn: Any = None
        self._pool: Any = None
        self._transaction: Any = None
        self._thread = None if self.asynchronous else ThreadPoolExecutor(1)

    async def run(self, work: Callable[[], Any]) -> Any:
        """``work()`` on the connection's own thread (a sync driver's)."""
        assert self._thread is not None
        return await asyncio.get_running_loop().run_in_executor(self._thread, work)

    async def open(self) -> None:
        d, url, options = self.driver, self.url, self.options
        if d == "asyncpg":
            self.conn = await asyncpg.connect(url, **options)
        elif d == "asyncpg-pool":
            self._pool = await asyncpg.create_pool(url, min_size=1, max_size=1, **options)
            self.conn = await self._pool.acquire()
        elif d == "psycopg-async":
            self.conn = await psycopg.AsyncConnection.connect(url, **options)
        elif d == "psycopg":
            self.conn = await self.run(lambda: psycopg.connect(url, **options))
        elif d == "pymysql":
            self.conn = await self.run(lambda: pymysql.connect(**mysql_args(url), **options))
        elif d == "asyncmy":
            self.conn = await asyncmy.connect(**mysql_args(url), **options)
        elif d == "sqlite3":
            path = make_url(url).database
            self.conn = await self.run(lambda: sqlite3.connect(path, timeout=60, **options))
        else:
            self.conn = await aiosqlite.connect(make_url(url).database, timeout=60, **options)

    async def close(self) -> None:
        if self.driver == "asyncpg-pool":
            await self._pool.release(self.conn)
            await self._pool.close()
        elif self.asynchronous:
            result = self.conn.close()
            if asyncio.iscoroutine(result):
                await result
        else:
            await self.run(self.conn.close)
            self._thread.shutdown()  # type: ignore[union-attr]

    async def begin(self) -> None:
        """Open a transaction the way the driver's users do: asyncpg's explicitly, the
        others' by their first statement."""
        if self.driver.startswith("asyncpg"):
            self._transaction = self.conn.transaction()
            await self._transaction.start()

    async def commit(self) -> None:
        await self._end("commit")

    async def rollback(self) -> None:
        await self._end("rollback")

    async def _end(self, how: str) -> None:
        if self.driver.startswith("asyncpg"):
            await getattr(self._transaction, how)()
        elif self.asynchronous:
            await getattr(self.conn, how)()
        else:
            await self.run(getattr(self.conn, how))

    async def execute(self, sql: str) -> None:
        """A statement of the caller's own (no parameters)."""
        if self.driver.startswith("asyncpg"):
            await self.conn.execute(sql)
        elif self.driver in ("psycopg-async", "aiosqlite"):
            await self.conn.execute(sql)
        elif self.driver == "asyncmy":
            async with self.conn.cursor() as cursor:
                await cursor.execute(sql)
        elif self.driver == "pymysql":
            await self.run(lambda: self.conn.cursor().execute(sql))
        else:
            await self.run(lambda: self.conn.execute(sql))

    async def publish(self, broker: Broker, method: str, *args: Any, **kwargs: Any) -> Any:
        """``broker.<method>(…, connection=…)``, or its ``_sync`` twin on a sync driver."""
        if self.asynchronous:
            return await getattr(broker, method)(*args, connection=self.conn, **kwargs)
        call = getattr(broker, f"{method}_sync")
        return await self.run(lambda: call(*args, connection=self.conn, **kwargs))


@contextlib.asynccontextmanager
async def driver_connection(driver: str, url: str, **options: Any,
                            ) -> AsyncIterator[DriverConnection]:
    conn = DriverConnection(driver, url, **options)
    await conn.open()
    try:
        yield conn
    finally:
        await conn.close()
