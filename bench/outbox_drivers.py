"""The outbox on each stack: a publish in the caller's transaction through SQLAlchemy (an
``AsyncConnection``, a sync ``Connection``) and through each driver's own connection
(asyncpg, psycopg async and sync on PostgreSQL; asyncmy and PyMySQL on MariaDB; aiosqlite
and sqlite3 on SQLite), and through Django's (``sqlmq.django.publish`` in
``transaction.atomic()``: psycopg, PyMySQL, sqlite3 under Django's wrapper), in
milliseconds per transaction (median):

* ``one``: a transaction holding one ``publish`` (its BEGIN and COMMIT included), awaited
  one after another;
* ``batch of 1,000``: a transaction holding one ``publish_batch`` of 1,000 messages, with
  the rate that makes in messages a second.

Each stack runs on fresh tables, after 20 unclocked transactions (connections, prepared
statements, compiled statements); the stacks' order turns by one each round. 64-byte
payloads, no subscriber.

    .venv/bin/python -m bench.outbox_drivers [--db all] [--count 300] [--batches 20]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from sqlalchemy import create_engine, make_url
from sqlalchemy.ext.asyncio import create_async_engine

from sqlmq import Broker
from sqlmq.connect import parse_url, sync_url

from .common import DATABASES, PAYLOAD, PREFIX, QUEUE, bench_broker, table, url_for
from .run import standalone_footer

BATCH = [PAYLOAD] * 1000
#: A transaction of the caller's with a publish in it: ``(broker, messages)``, where
#: ``messages`` is None for one ``publish``, else the batch.
Transaction = Callable[[Broker, list[bytes] | None], Awaitable[None]]
Opener = Callable[[str, AsyncExitStack], Awaitable[Transaction]]


async def _publish(broker: Broker, conn: Any, messages: list[bytes] | None) -> None:
    if messages is None:
        await broker.publish(QUEUE, PAYLOAD, connection=conn)
    else:
        await broker.publish_batch(QUEUE, messages, connection=conn)


def _publish_sync(broker: Broker, conn: Any, messages: list[bytes] | None) -> None:
    if messages is None:
        broker.publish_sync(QUEUE, PAYLOAD, connection=conn)
    else:
        broker.publish_batch_sync(QUEUE, messages, connection=conn)


def _mysql_args(url: str) -> dict[str, Any]:
    u = make_url(url)
    return {"host": u.host, "port": u.port or 3306, "user": u.username,
            "password": u.password or "", "database": u.database}


async def _sqlalchemy(url: str, stack: AsyncExitStack) -> Transaction:
    engine = create_async_engine(parse_url(url))
    stack.push_async_callback(engine.dispose)

    async def run(broker: Broker, messages: list[bytes] | None) -> None:
        async with engine.begin() as conn:
            await _publish(broker, conn, messages)
    return run


async def _sqlalchemy_sync(url: str, stack: AsyncExitStack) -> Transaction:
    engine = create_engine(sync_url(parse_url(url)))
    stack.callback(engine.dispose)

    async def run(broker: Broker, messages: list[bytes] | None) -> None:
        with engine.begin() as conn:
            _publish_sync(broker, conn, messages)
    return run


def _in_transaction(connect: Callable[[str], Awaitable[Any]]) -> Opener:
    """A driver connection whose ``transaction()`` holds the publish (asyncpg, psycopg)."""
    async def opener(url: str, stack: AsyncExitStack) -> Transaction:
        conn = await connect(url)
        stack.push_async_callback(conn.close)

        async def run(broker: Broker, messages: list[bytes] | None) -> None:
            async with conn.transaction():
                await _publish(broker, conn, messages)
        return run
    return opener


def _asyncpg(url: str) -> Awaitable[Any]:
    import asyncpg

    return asyncpg.connect(url)


def _psycopg_async(url: str) -> Awaitable[Any]:
    import psycopg

    return psycopg.AsyncConnection.connect(url)


async def _psycopg(url: str, stack: AsyncExitStack) -> Transaction:
    import psycopg

    conn = psycopg.connect(url)
    stack.callback(conn.close)

    async def run(broker: Broker, messages: list[bytes] | None) -> None:
        with conn.transaction():
            _publish_sync(broker, conn, messages)
    return run


async def _asyncmy(url: str, stack: AsyncExitStack) -> Transaction:
    import asyncmy

    conn = await asyncmy.connect(**_mysql_args(url))
    stack.callback(conn.close)

    async def run(broker: Broker, messages: list[bytes] | None) -> None:
        await _publish(broker, conn, messages)
        await conn.commit()
    return run


async def _pymysql(url: str, stack: AsyncExitStack) -> Transaction:
    import pymysql

    conn = pymysql.connect(**_mysql_args(url))
    stack.callback(conn.close)

    async def run(broker: Broker, messages: list[bytes] | None) -> None:
        _publish_sync(broker, conn, messages)
        conn.commit()
    return run


_django_ready = False


def _django_settings() -> None:
    """Django on the bench's databases, one alias each (once a process)."""
    global _django_ready
    if _django_ready:
        return
    import os

    import django
    import pymysql
    from django.conf import settings

    pymysql.install_as_MySQLdb()  # Django's MySQL backend on PyMySQL, as docs/django.md says
    # The bench's loop is async and the Django stack blocks it, as the sync stacks do:
    # Django would otherwise refuse its ORM calls from a thread that runs an event loop.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

    def server(engine: str, url: str, port: int) -> dict[str, Any]:
        u = make_url(url)
        return {"ENGINE": engine, "NAME": u.database, "USER": u.username,
                "PASSWORD": u.password or "", "HOST": u.host, "PORT": u.port or port}

    settings.configure(
        INSTALLED_APPS=["sqlmq.django"], USE_TZ=True,
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3",
                       "NAME": make_url(url_for("sqlite")).database,
                       "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 60}},
            "postgresql": server("django.db.backends.postgresql", url_for("postgresql"), 5432),
            "mariadb": server("django.db.backends.mysql", url_for("mariadb"), 3306)})
    django.setup()
    _django_ready = True


def _django(db: str) -> Opener:
    """``sqlmq.django.publish`` in ``transaction.atomic()`` on Django's connection."""
    alias = "default" if db == "sqlite" else db

    async def opener(url: str, stack: AsyncExitStack) -> Transaction:
        _django_settings()
        from django.db import connections, transaction
        from django.test import override_settings

        import sqlmq.django

        stack.enter_context(override_settings(SQLMQ={"DATABASE": alias,
                                                     "TABLE_PREFIX": PREFIX}))
        stack.callback(connections[alias].close)  # SQLite's file goes with the case's tables

        async def run(broker: Broker, messages: list[bytes] | None) -> None:
            with transaction.atomic(using=alias):
                if messages is None:
                    sqlmq.django.publish(QUEUE, PAYLOAD)
                else:
                    sqlmq.django.publish_batch(QUEUE, messages)
        return run
    return opener


async def _aiosqlite(url: str, stack: AsyncExitStack) -> Transaction:
    import aiosqlite

    conn = await aiosqlite.connect(make_url(url).database, timeout=60)
    stack.push_async_callback(conn.close)

    async def run(broker: Broker, messages: list[bytes] | None) -> None:
        await _publish(broker, conn, messages)  # sqlmq begins it (BEGIN IMMEDIATE)
        await conn.commit()
    return run


async def _sqlite3(url: str, stack: AsyncExitStack) -> Transaction:
    conn = sqlite3.connect(make_url(url).database, timeout=60)
    stack.callback(conn.close)

    async def run(broker: Broker, messages: list[bytes] | None) -> None:
        with conn:  # commits
            _publish_sync(broker, conn, messages)
    return run


#: Per database, each stack: SQLAlchemy's two, the drivers' own connections, Django's.
STACKS: dict[str, list[tuple[str, Opener]]] = {
    "postgresql": [("SQLAlchemy AsyncConnection (asyncpg)", _sqlalchemy),
                   ("SQLAlchemy Connection (psycopg)", _sqlalchemy_sync),
                   ("asyncpg", _in_transaction(_asyncpg)),
                   ("psycopg AsyncConnection", _in_transaction(_psycopg_async)),
                   ("psycopg Connection", _psycopg),
                   ("Django atomic() (psycopg)", _django("postgresql"))],
    "mariadb": [("SQLAlchemy AsyncConnection (asyncmy)", _sqlalchemy),
                ("SQLAlchemy Connection (PyMySQL)", _sqlalchemy_sync),
                ("asyncmy", _asyncmy), ("PyMySQL", _pymysql),
                ("Django atomic() (PyMySQL)", _django("mariadb"))],
    "sqlite": [("SQLAlchemy AsyncConnection (aiosqlite)", _sqlalchemy),
               ("SQLAlchemy Connection (sqlite3)", _sqlalchemy_sync),
               ("aiosqlite", _aiosqlite), ("sqlite3", _sqlite3),
               ("Django atomic() (sqlite3)", _django("sqlite"))],
}


async def measure(db: str, opener: Opener, count: int, batches: int) -> tuple[float, float]:
    """Median ms of ``count`` one-publish transactions and of ``batches`` batch ones."""
    async with bench_broker(db) as broker, AsyncExitStack() as stack:
        run = await opener(url_for(db), stack)
        for _ in range(20):
            await run(broker, None)
        await run(broker, BATCH)
        medians = []
        for messages, n in ((None, count), (BATCH, batches)):
            times = []
            for _ in range(n):
                start = time.perf_counter()
                await run(broker, messages)
                times.append(time.perf_counter() - start)
            medians.append(statistics.median(times) * 1000)
        return medians[0], medians[1]


async def main(args: argparse.Namespace) -> None:
    dbs = DATABASES if args.db == "all" else (args.db,)
    one: dict[tuple[str, str], list[float]] = {}
    batch: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for db in dbs:
            stacks = STACKS[db][r % len(STACKS[db]):] + STACKS[db][:r % len(STACKS[db])]
            for name, opener in stacks:
                single, many = await measure(db, opener, args.count, args.batches)
                one.setdefault((db, name), []).append(single)
                batch.setdefault((db, name), []).append(many)
    rows = []
    for db in dbs:
        for name, _ in STACKS[db]:
            b = statistics.median(batch[db, name])
            rows.append((db, name, f"{statistics.median(one[db, name]):.2f}", f"{b:.1f}",
                         f"{1000 / b * 1000:,.0f}"))
    print(table(f"The outbox by stack: ms per transaction (median of {args.count} one-publish "
                f"and {args.batches} batch transactions, median of {args.rounds} rounds)",
                ["database", "caller's connection", "one publish, ms",
                 "batch of 1,000, ms", "batch msg/s"], rows))
    print(standalone_footer("outbox_drivers", args, "count") + f" --batches {args.batches}")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default="all", choices=[*DATABASES, "all"])
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(_args()))
