"""Every ```python block of README.md and docs/*.md runs, so the docs cannot drift.

A block runs as it is printed, with top-level ``await`` allowed, after the set-up a reader
has at that point (``broker`` a migrated Broker; for the outbox an ``Order`` model and the
user's ``engine``/``sync_engine``), on each database. The only edits are the ones a reader
makes too: the example URL becomes the test database's, the tables get the test's prefix,
and ``s3://lake`` becomes a temporary directory. The Spark blocks run in the Spark pass.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import re
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Float, Integer, create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import declarative_base

from sqlmq import Broker
from sqlmq.connect import parse_url, sync_url

from .conftest import drop_tables, rows
from .test_periodic import published_ticks

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Snippet:
    path: str
    line: int
    code: str

    @property
    def uses_spark(self) -> bool:
        return bool(re.search(r'\bspark\b|pyspark|\bF\.|format\("sqlmq"\)', self.code))

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


def snippets() -> list[Snippet]:
    found = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        start = None
        for i, line in enumerate(lines):
            if start is None and line.strip() == "```python":
                start = i + 1
            elif start is not None and line.strip() == "```":
                found.append(Snippet(str(doc.relative_to(ROOT)), start,
                                     "\n".join(lines[start:i]) + "\n"))
                start = None
    return found


PLAIN = [s for s in snippets() if not s.uses_spark]
SPARK = [s for s in snippets() if s.uses_spark]


def test_every_python_block_is_found_and_compiles() -> None:
    assert len(PLAIN) >= 4 and len(SPARK) >= 6
    for snippet in snippets():
        compile(snippet.code, str(snippet), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def localise(code: str, url: str, prefix: str, tmp: Path) -> str:
    """The edits a reader makes: their database, their tables, their storage."""
    # memory:// needs no database: a reader's unit test keeps it as it is
    code = re.sub(r'Broker\("(?!memory://)[^"]*"\)', f"Broker({url!r}, table_prefix={prefix!r})",
                  code)
    code = re.sub(r'"url": "[^"]*"', f'"url": {url!r}, "prefix": {prefix!r}', code)
    return code.replace("s3://lake", str(tmp / "lake"))


async def execute(snippet: Snippet, code: str, namespace: dict[str, Any]) -> None:
    compiled = compile(code, str(snippet), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)
    if inspect.iscoroutine(result):
        await result
    # a block that defines a unit test (``async def test_…``) promises it passes: run it as
    # pytest would, since ``__main__`` guards do not fire here
    for name, value in list(namespace.items()):
        if name.startswith("test_") and inspect.iscoroutinefunction(value):
            await value()


def order_model(prefix: str) -> Any:
    """The reader's own ORM model for the outbox example, on a table of this test."""
    base: Any = declarative_base()

    class Order(base):  # type: ignore[misc,valid-type]
        __tablename__ = f"{prefix}order"
        id = Column(Integer, primary_key=True, autoincrement=True)
        total = Column(Float, nullable=False)

    return Order


async def _interrupt_when_running(namespace: dict[str, Any]) -> None:
    """``await broker.run()`` runs until SIGINT, as a reader's worker would: send it once
    the snippet's broker has started."""
    while not getattr(namespace.get("broker"), "_started", False):
        await asyncio.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("snippet", PLAIN, ids=str)
async def test_snippet_runs(snippet: Snippet, db_url: str, prefix: str, tmp_path: Path) -> None:
    code = localise(snippet.code, db_url, prefix, tmp_path)
    broker = Broker(db_url, table_prefix=prefix)
    await broker.migrate()
    order = order_model(prefix)
    user_tables = order.metadata
    sync_engine = create_engine(sync_url(parse_url(db_url)))
    engine = create_async_engine(parse_url(db_url))
    user_tables.create_all(sync_engine)
    namespace: dict[str, Any] = {"__name__": "docs_snippet", "broker": broker, "Order": order,
                                 "engine": engine, "sync_engine": sync_engine}
    interrupt = asyncio.create_task(_interrupt_when_running(namespace)
                                    if "broker.run()" in snippet.code else asyncio.sleep(0))
    try:
        await execute(snippet, code, namespace)
        await check(snippet, namespace)
    finally:
        interrupt.cancel()
        await broker.close()
        if namespace.get("broker") is not broker:
            await namespace["broker"].close()
        await engine.dispose()
        user_tables.drop_all(sync_engine)
        sync_engine.dispose()
        drop_tables(db_url, prefix)


async def check(snippet: Snippet, namespace: dict[str, Any]) -> None:
    """What each block promises, beyond running."""
    broker: Broker = namespace["broker"]
    if "connection=session" in snippet.code:  # the outbox: real ids, not None
        bodies = [json.loads(r["payload"]) for r in await rows(broker, "message")]
        assert len(bodies) == 2 and all(isinstance(b["id"], int) for b in bodies), bodies
    elif 'publish_batch("orders", [{"id": i}' in snippet.code:  # README's Publishing
        assert len(await rows(broker, "message")) == 1005
    elif 'publish_topic("orders.created"' in snippet.code:  # README's topics: a copy each
        assert sorted(g.queue for g in await broker.groups()) == ["audit@orders.#",
                                                                  "billing@orders.*"]
        copies = await rows(broker, "message") + await rows(broker, "archive")
        assert sorted(r["queue"] for r in copies) == ["audit@orders.#", "billing@orders.*"]
    elif "invoices.append(invoice)" in snippet.code:  # README's pipeline: one invoice
        assert namespace["invoices"] == [{"order": 1, "due": 12.0}]
        states = sorted(r["state"] for r in await rows(broker, "archive", queue="orders"))
        assert states == ["COMPLETED", "COMPLETED"]
    elif "beats.append" in snippet.code:  # README's schedules: a message per tick
        ticks = await published_ticks(broker, "heartbeat")
        step = timedelta(seconds=0.2)  # (a late round may skip a tick: catch_up="latest")
        assert len(ticks) == len(set(ticks)) >= 3 and all(
            (t - ticks[0]) % step == timedelta(0) for t in ticks), ticks
    elif "handled.append" in snippet.code:  # README's channels
        assert sorted(namespace["handled"]) == sorted(
            [("tenant-1", f"u{i}") for i in range(20)] + [("tenant-2", "vip")])
        assert {c.name: (c.effective.max_concurrency, c.waiting) for c in
                await broker.channels()} == {"tenant-1": (2, 0), "tenant-2": (4, 0),
                                             "mailer-api": (None, 0)}
    elif "pages.append(done)" in snippet.code:  # README's defer and cancel
        assert namespace["pages"] == [0, 1, 2, 3]
        states = sorted(r["state"] for r in await rows(broker, "archive", queue="exports"))
        assert states == ["CANCELLED", "COMPLETED"]
        (row,) = await rows(broker, "archive", queue="exports", state="COMPLETED")
        assert (row["attempts_count"], row["deliveries_count"]) == (1, 4)
    elif "billed.append" in snippet.code:  # README's operations: paused, then resumed
        assert sorted(namespace["billed"]) == [0, 1, 2]
        assert await broker.paused() == [] and await broker.workers() == []
    elif "ack_policy=" in snippet.code:
        (sub,) = broker.subscribers
        assert sub.queues == ("orders", "refunds")
    elif "await broker.run()" in snippet.code:
        (row,) = await rows(broker, "message")
        assert json.loads(row["payload"]) == {"id": 7} and row["headers"]["tenant"] == "a"
        assert [s.adapter.name for s in broker.subscribers] == ["charge"]

# The Spark blocks run in tests/spark/test_docs_spark.py (the Spark pass).
