"""``sqlmq demo``: the whole lifecycle on a real database in about ten seconds.

Worker processes share one queue; about one message in eight fails its first attempt and is
retried with backoff; one in fifty always fails and ends FAILED in the archive when its
retries run out; one poison message kills whichever process handles it, until
``max_deliveries`` stops it. The parent restarts dead workers, draws a progress bar and
prints what the database says at the end.

The failures are the demo's point, but their tracebacks are not what a newcomer should read
first: every process logs to one file (next to a SQLite database, else in the temp
directory), the terminal shows a line per dead letter, and the summary names the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from .broker import Broker
from .connect import parse_url, sync_url
from .engines import create_sync
from .lifecycle import State
from .message import Message
from .retry import Retry
from .schema import build_schema

QUEUE = "demo"
PREFIX = "sqlmq_demo_"
LEASE = 2.0
MAX_DELIVERIES = 5


def _fate(n: int) -> str:
    bucket = zlib.crc32(str(n).encode()) % 100
    if bucket < 2:
        return "always-fails"
    if bucket < 14:
        return "fails-once"
    return "ok"


def _worker_main(url: str, prefix: str, log_path: str) -> None:
    """A worker process: one subscriber, run until SIGTERM, logging to ``log_path``."""
    _log_to(log_path)
    broker = Broker(url, table_prefix=prefix, recovery_interval=0.25, recovery_spread=1.0)

    @broker.subscriber(QUEUE, workers=8, fetch_batch=25, lease=LEASE,
                       max_deliveries=MAX_DELIVERIES,
                       retry=Retry.exponential(initial=0.05, max_attempts=3, jitter=0.2))
    async def handle(msg: Message) -> None:
        body = msg.body
        if body.get("poison"):
            os._exit(17)  # like an OOM kill or a segfault: no exception, no cleanup
        fate = _fate(body["n"])
        if fate == "always-fails" or (fate == "fails-once" and msg.attempts == 0):
            raise RuntimeError(f"payment gateway timeout for order {body['n']}")
        await asyncio.sleep(0.0005)

    asyncio.run(broker.run())


async def run_demo(url: str, *, messages: int = 5000, processes: int = 2,
                   prefix: str = PREFIX) -> int:
    from rich.console import Console

    console = Console()
    _reset_tables(url, prefix)
    log_path = demo_log_path(url)
    with _logging_to(log_path):
        broker = Broker(url, table_prefix=prefix)
        await broker.migrate()
        console.print(f"[bold]sqlmq demo[/] on {broker.url}: {messages} messages, "
                      f"{processes} worker processes, lease {LEASE:.0f}s, "
                      f"max_deliveries {MAX_DELIVERIES}")
        started = time.monotonic()
        total = await _publish(broker, messages)
        crashes, finished = await _run_workers(broker, (url, prefix, log_path), processes,
                                               total, messages, console)
        elapsed = finished - started
        found = await _measure(broker)
        await broker.close()
    _print_table(console, found, total, crashes, elapsed)
    console.print(f"Every failure's traceback, and what else the processes logged: {log_path}",
                  soft_wrap=True)
    command = sqlmq_command()
    console.print(f"Inspect it: {command} queues --url {broker.url} --prefix {prefix}; "
                  f"{command} dlq list --url {broker.url} --prefix {prefix}")
    ok = found["left"] == 0 and sum(found["states"].values()) == total
    return 0 if ok else 1


async def _publish(broker: Broker, messages: int) -> int:
    """The demo's messages, a poison one among them; how many in all."""
    bodies: list[dict[str, Any]] = [{"n": n} for n in range(messages)]
    bodies.insert(messages // 3, {"poison": True, "n": -1})
    for i in range(0, len(bodies), 1000):
        await broker.publish_batch(QUEUE, bodies[i : i + 1000])
    return len(bodies)


async def _run_workers(broker: Broker, args: tuple[str, str, str], processes: int, total: int,
                       messages: int, console: Any) -> tuple[int, float]:
    """Run worker processes (``_worker_main(*args)``) until every message is archived
    (restarting the ones the poison message kills), drawing a progress bar and a line per
    dead letter; then stop them. How many crashed, and when the work was done (before the
    stop)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_worker_main, args=args, daemon=True) for _ in range(processes)]
    for w in workers:
        w.start()
    crashes = 0
    archive = broker.schema.archive
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("archived", total=total)
        done = 0
        shown: set[int] = set()
        deadline = time.monotonic() + 120 + messages / 200
        while done < total and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            async with broker.db.connect() as conn:
                done = (await conn.execute(select(func.count()).select_from(archive))).scalar_one()
            progress.update(task, completed=done,
                            description=f"archived (worker crashes: {crashes})")
            await _show_dead_letters(broker, shown, progress.console)
            for i, w in enumerate(workers):
                if not w.is_alive():
                    crashes += 1
                    workers[i] = ctx.Process(target=_worker_main, args=args, daemon=True)
                    workers[i].start()
    finished = time.monotonic()
    for w in workers:
        if w.is_alive():
            os.kill(w.pid, signal.SIGTERM)  # type: ignore[arg-type]
    for w in workers:
        w.join(timeout=30)
    return crashes, finished


async def _show_dead_letters(broker: Broker, shown: set[int], console: Any) -> None:
    """One line for each dead letter not shown yet: its id and its error's first line (the
    traceback is in the log file)."""
    archive = broker.schema.archive
    async with broker.db.connect() as conn:
        ids = set((await conn.execute(
            select(archive.c.id).where(archive.c.state == State.FAILED))).scalars()) - shown
        if not ids:
            return
        found = (await conn.execute(select(archive.c.id, archive.c.error).where(
            archive.c.id.in_(sorted(ids))).order_by(archive.c.id))).all()
    for msg_id, error in found:
        shown.add(msg_id)
        console.print(f"dead letter {msg_id}: {(error or '').split(chr(10), 1)[0]}",
                      markup=False, highlight=False, no_wrap=True, overflow="ellipsis")


async def _measure(broker: Broker) -> dict[str, Any]:
    """What the database says at the end."""
    archive = broker.schema.archive
    async with broker.db.connect() as conn:
        states = dict((await conn.execute(
            select(archive.c.state, func.count()).group_by(archive.c.state))).all())
        deliveries = dict((await conn.execute(
            select(archive.c.deliveries_count, func.count())
            .group_by(archive.c.deliveries_count))).all())
        exhausted = (await conn.execute(
            select(func.count()).select_from(archive).where(
                archive.c.state == State.FAILED, archive.c.error.like("retries exhausted%"))
        )).scalar_one()
        retried = (await conn.execute(
            select(func.count()).select_from(archive).where(archive.c.attempts_count > 1)
        )).scalar_one()
        poison = (await conn.execute(
            select(archive.c.state, archive.c.deliveries_count, archive.c.error)
            .where(archive.c.id.in_(select(archive.c.id).where(
                archive.c.payload.like(b'%"poison"%'))))
        )).first()
    left = sum(s.pending + s.processing + s.retryable for s in await broker.stats())
    return {"states": states, "deliveries": deliveries, "exhausted": exhausted,
            "retried": retried, "poison": poison, "left": left}


def _print_table(console: Any, found: dict[str, Any], total: int, crashes: int,
                 elapsed: float) -> None:
    from rich.table import Table

    states, deliveries, poison = found["states"], found["deliveries"], found["poison"]
    table = Table(title="sqlmq demo: what the database says")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("messages published", str(total))
    table.add_row("archived COMPLETED", str(states.get(State.COMPLETED, 0)))
    failed = states.get(State.FAILED, 0)
    table.add_row("archived FAILED (dead letters)", str(failed))
    table.add_row("  of which: retries exhausted", str(found["exhausted"]))
    table.add_row("  of which: max deliveries exceeded", str(failed - found["exhausted"]))
    table.add_row("left in the queue", str(found["left"]))
    table.add_row("messages that needed a retry", str(found["retried"]))
    for n in sorted(deliveries):
        table.add_row(f"messages delivered {n}×", str(deliveries[n]))
    table.add_row("worker crashes (poison message)", str(crashes))
    if poison is not None:
        table.add_row("poison message", f"{poison.state} after {poison.deliveries_count} "
                                        f"deliveries: {poison.error}")
    table.add_row("elapsed", f"{elapsed:.1f} s")
    table.add_row("throughput", f"{total / elapsed:,.0f} msg/s (incl. retries and backoff)")
    console.print(table)


def sqlmq_command(argv0: str | None = None) -> str:
    """How to run ``sqlmq`` again from this shell: ``sqlmq`` when that name on PATH is the
    program running now, else the path it was started by (``./dev demo`` runs
    ``.venv/bin/sqlmq``, which is not on PATH), else ``python -m sqlmq.cli``."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) != "sqlmq":
        return f"{shlex.quote(sys.executable)} -m sqlmq.cli"
    on_path = shutil.which("sqlmq")
    if on_path is not None and os.path.exists(argv0) and os.path.samefile(on_path, argv0):
        return "sqlmq"
    path = os.path.relpath(argv0) if os.path.isabs(argv0) else argv0
    if not path.startswith((".", "/")):
        path = os.path.join(".", path)
    return shlex.quote(path)


def _reset_tables(url: str, prefix: str) -> None:
    """Start every demo from empty tables of its own prefix."""
    engine = create_sync(sync_url(parse_url(url)))
    try:
        build_schema(prefix).metadata.drop_all(engine)
    finally:
        engine.dispose()


def demo_log_path(url: str) -> str:
    """Where the demo's processes log: beside a SQLite database (``sqlmq-demo.db`` ->
    ``sqlmq-demo.log``), else a file of this run's own in the temp directory. Emptied here,
    as the tables are: it holds one run."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        db = Path(parsed.database).resolve()
        path = db.with_suffix(".log") if db.suffix != ".log" else db.with_name(db.name + ".log")
    else:
        path = Path(tempfile.gettempdir()) / f"sqlmq-demo-{os.getpid()}.log"
    path.write_text("")
    return str(path)


def _log_to(path: str) -> logging.Handler:
    """Send every log record of this process to ``path`` (appended: the demo's processes
    share it) instead of the terminal, where the progress bar is; the handler."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(
        "%(asctime)s pid %(process)d %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


@contextlib.contextmanager
def _logging_to(path: str) -> Iterator[None]:
    """:func:`_log_to` for the demo's own process, whose logging is put back afterwards (the
    command may run inside another program)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    handler = _log_to(path)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        for old in handlers:
            root.addHandler(old)
        root.setLevel(level)
