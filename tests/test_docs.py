"""Every ```python block of README.md and docs/**/*.md runs, so the docs cannot drift.

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
import sys
import types
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Float, Integer, create_engine, make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import declarative_base

from sqlmq import Broker
from sqlmq.connect import parse_url, sync_url

from .conftest import DATABASES, drop_tables, rows
from .test_periodic import published_ticks

ROOT = Path(__file__).resolve().parent.parent
#: The drivers a reader's snippet may import, by the database they speak to.
DRIVERS = {"postgresql": ["asyncpg", "psycopg"], "mariadb": ["pymysql", "asyncmy"],
           "sqlite": ["sqlite3", "aiosqlite"]}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


@dataclass(frozen=True)
class Snippet:
    path: str
    line: int
    code: str

    @property
    def uses_spark(self) -> bool:
        return bool(re.search(r'\bspark\b|pyspark|\bF\.|format\("sqlmq"\)', self.code))

    @property
    def uses_django(self) -> bool:
        return bool(re.search(r"\bdjango\b", self.code))

    @property
    def databases(self) -> list[str]:
        """Where it runs: on the database its driver speaks to, if it imports one (the
        outbox on a driver's own connection), else on each."""
        for database, drivers in DRIVERS.items():
            if re.search(rf"^import ({'|'.join(drivers)})$", self.code, re.MULTILINE):
                return [database]
        return DATABASES

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


PLAIN = [s for s in snippets() if not s.uses_spark and not s.uses_django]
DJANGO = [s for s in snippets() if s.uses_django]
SPARK = [s for s in snippets() if s.uses_spark]


def test_every_python_block_is_found_and_compiles() -> None:
    assert len(PLAIN) >= 4 and len(SPARK) >= 6 and len(DJANGO) >= 5
    for snippet in snippets():
        compile(snippet.code, str(snippet), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def localise(code: str, url: str, prefix: str, tmp: Path) -> str:
    """The edits a reader makes: their database, their tables, their storage."""
    # memory:// needs no database: a reader's unit test keeps it as it is
    code = re.sub(r'Broker\("(?!memory://)[^"]*"\)', f"Broker({url!r}, table_prefix={prefix!r})",
                  code)
    code = re.sub(r'"url": "[^"]*"', f'"url": {url!r}, "prefix": {prefix!r}', code)
    # a driver's own connection (the outbox): to the test's database, the test's orders
    parsed = make_url(url)
    mysql = (f"host={parsed.host!r}, port={parsed.port or 3306}, user={parsed.username!r}, "
             f"password={parsed.password or ''!r}, database={parsed.database!r}")
    code = (code.replace('"postgresql://app@db/app"', repr(url))
            .replace('"app.db"', repr(parsed.database))
            .replace('host="db", user="app", password="secret", database="app"', mysql)
            .replace("INTO orders ", f"INTO {prefix}order "))
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


@pytest.mark.parametrize(("snippet", "db_kind"),
                         [pytest.param(s, d, id=f"{d}-{s}") for s in PLAIN for d in s.databases])
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


#: The endings each workflow of the docs' blocks comes to, by step.
WORKFLOW_ENDINGS = {
    "order-7": {"charge": "COMPLETED", "ship": "COMPLETED", "email": "COMPLETED"},
    "order-8": {"charge": "FAILED", "ship": "CANCELLED", "release-stock": "COMPLETED"},
    "nightly": {"export": "CANCELLED", "report": "CANCELLED"},
    "invoice-12": {"render": "PENDING", "send": "WAITING"},
    "album-3": {"resize": "COMPLETED", "resize-2": "COMPLETED", "resize-3": "COMPLETED",
                "album": "COMPLETED"},
}


async def workflows_as_told(broker: Broker, snippet: Snippet) -> None:
    """Each workflow a block publishes ends as the docs say it does."""
    names = [w.name for w in await broker.workflows()]
    assert names, f"{snippet} published no workflow"
    for name in names:
        for _ in range(1000):
            got = {s.name: s.state for s in (await broker.workflow_status(name)).steps}
            if got == WORKFLOW_ENDINGS[name]:
                break
            await asyncio.sleep(0.02)
        assert got == WORKFLOW_ENDINGS[name], f"{snippet}: workflow {name}: {got}"


async def check(snippet: Snippet, namespace: dict[str, Any]) -> None:
    """What each block promises, beyond running."""
    broker: Broker = namespace["broker"]
    if not isinstance(broker, Broker):  # a FastStream broker's block asserts its own promises
        return
    outbox = ("connection=session" if "connection=session" in snippet.code else
              "connection=conn" if snippet.databases != DATABASES else None)
    if outbox is not None:  # the outbox (SQLAlchemy's or a driver's): real ids, not None
        bodies = [json.loads(r["payload"]) for r in await rows(broker, "message")]
        published = snippet.code.count(outbox)  # one message per publish
        assert len(bodies) == published and all(isinstance(b["id"], int) for b in bodies), \
            bodies
    elif 'publish_batch("orders", [{"id": i}' in snippet.code:  # docs/publishing.md
        assert len(await rows(broker, "message")) == 1005
    elif 'publish_topic("orders.created"' in snippet.code:  # topics: a copy each
        assert sorted(g.queue for g in await broker.groups()) == ["audit@orders.#",
                                                                  "billing@orders.*"]
        copies = await rows(broker, "message") + await rows(broker, "archive")
        assert sorted(r["queue"] for r in copies) == ["audit@orders.#", "billing@orders.*"]
    elif "invoices.append(invoice)" in snippet.code:  # docs/consuming.md's pipeline: one invoice
        assert namespace["invoices"] == [{"order": 1, "due": 12.0}]
        states = sorted(r["state"] for r in await rows(broker, "archive", queue="orders"))
        assert states == ["COMPLETED", "COMPLETED"]
    elif "broker.workflow(" in snippet.code:  # docs/workflows.md, README: as told
        await workflows_as_told(broker, snippet)
    elif "beats.append" in snippet.code:  # docs/scheduling.md: a message per tick
        ticks = await published_ticks(broker, "heartbeat")
        step = timedelta(seconds=0.2)  # (a late round may skip a tick: catch_up="latest")
        assert len(ticks) == len(set(ticks)) >= 3 and all(
            (t - ticks[0]) % step == timedelta(0) for t in ticks), ticks
    elif "handled.append" in snippet.code:  # docs/channels.md
        assert sorted(namespace["handled"]) == sorted(
            [("tenant-1", f"u{i}") for i in range(20)] + [("tenant-2", "vip")])
        assert {c.name: (c.effective.max_concurrency, c.waiting) for c in
                await broker.channels()} == {"tenant-1": (2, 0), "tenant-2": (4, 0),
                                             "mailer-api": (None, 0)}
    elif "pages.append(done)" in snippet.code:  # docs/consuming.md's defer and cancel
        assert namespace["pages"] == [0, 1, 2, 3]
        states = sorted(r["state"] for r in await rows(broker, "archive", queue="exports"))
        assert states == ["CANCELLED", "COMPLETED"]
        (row,) = await rows(broker, "archive", queue="exports", state="COMPLETED")
        assert (row["attempts_count"], row["deliveries_count"]) == (1, 4)
    elif "billed.append" in snippet.code:  # the 3 a.m. guide: paused, resumed
        assert sorted(namespace["billed"]) == [0, 1, 2]
        assert await broker.paused() == [] and await broker.workers() == []
    elif "ack_policy=" in snippet.code:
        (sub,) = broker.subscribers
        assert sub.queues == ("orders", "refunds")
    elif "await broker.run()" in snippet.code:
        (row,) = await rows(broker, "message")
        assert json.loads(row["payload"]) == {"id": 7} and row["headers"]["tenant"] == "a"
        assert [s.adapter.name for s in broker.subscribers] == ["charge"]

@pytest.mark.parametrize("snippet", [pytest.param(s, id=f"sqlite-{s}") for s in DJANGO])
def test_django_snippet_runs(snippet: Snippet, prefix: str) -> None:
    """A Django block runs in the test project (tests/djangosite), on its default database
    (SQLite; the project's own tests run on each database), as a module of its own so that
    its tasks can be imported by path. A block with ``await`` runs on an event loop of its
    own, from sync code, as ``asyncio.run`` in a management command would."""
    from django.test import override_settings

    from sqlmq.django import subscribers
    from sqlmq.django.config import config
    from sqlmq.django.portal import portal
    from sqlmq.django.tasks import TaskBackend

    from .djangosite.harness import site

    code = snippet.code.replace("from shop.", "from tests.djangosite.shop.")
    module = types.ModuleType("docs_django_snippet")
    sys.modules[module.__name__] = module
    declared = list(subscribers._declared)
    try:
        with site("sqlite", prefix):
            import sqlmq.django

            compiled = compile(code, str(snippet), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            result = eval(compiled, module.__dict__)
            if inspect.iscoroutine(result):
                asyncio.run(result)
            b = sqlmq.django.broker()
            published = sum(snippet.code.count(call) for call in
                            ("sqlmq.django.publish(", "apublish(", ".enqueue("))
            assert len(portal.call(lambda: rows(b, "message"))) == published
            namespace = module.__dict__
            if "SQLMQ" in namespace:  # settings.py: what sqlmq.django accepts
                with override_settings(SQLMQ=namespace["SQLMQ"]):
                    assert config().database == "default"
                backend = namespace["TASKS"]["default"]
                assert isinstance(TaskBackend("default", backend), TaskBackend)
            if "@sqlmq.django.subscriber" in snippet.code:
                assert subscribers._declared[len(declared):][0].handler.__name__ == "ship"
    finally:
        subscribers._declared[:] = declared
        del sys.modules[module.__name__]

# The Spark blocks run in tests/spark/test_docs_spark.py (the Spark pass).


def test_the_api_reference_names_every_public_name() -> None:
    """docs/reference/ renders each name of ``sqlmq.__all__`` (and only those): a name
    added to the package's exports gets its ``::: sqlmq.NAME`` in docs/reference/api.md."""
    import sqlmq

    pages = (ROOT / "docs" / "reference").glob("*.md")
    named = {m for page in pages for m in re.findall(r"^::: sqlmq\.(\w+)$", page.read_text(),
                                                     re.MULTILINE)}
    assert set(sqlmq.__all__) - named == set(), "add them to docs/reference/api.md"
    assert named - set(sqlmq.__all__) == set(), "not exported by sqlmq: drop them"
