"""Several processes opening a new SQLite file at the same moment (workers started together
on a fresh database): each connection switches the file to WAL, and SQLite answers the
losers of that race "database is locked" at once, without waiting on the busy timeout. Every
process must connect, and the file must end in WAL mode.

Real processes, released together by a barrier, on a new file each round: the race is short,
so it takes many rounds to lose it reliably (about one round in twenty lost it before).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from .procs import fork_server

ROUNDS = 60
PROCESSES = 8


def _opener(use_async: bool, tasks: Any, barrier: Any, results: Any) -> None:
    """One process: for each URL it is given, build the engine, wait for the others, then
    connect (the engine is built first so that the connects start together)."""
    from sqlalchemy import text

    from sqlmq.connect import parse_url, sync_url
    from sqlmq.engines import create_async, create_sync

    async def go_async(url: str) -> str:
        engine = create_async(parse_url(url))
        try:
            await asyncio.to_thread(barrier.wait, 60)
            async with engine.connect() as conn:
                return str((await conn.execute(text("PRAGMA journal_mode"))).scalar())
        finally:
            await engine.dispose()

    def go_sync(url: str) -> str:
        engine = create_sync(sync_url(parse_url(url)))
        try:
            barrier.wait(60)
            with engine.connect() as conn:
                return str(conn.execute(text("PRAGMA journal_mode")).scalar())
        finally:
            engine.dispose()

    for url in iter(tasks.get, None):
        try:
            results.put(asyncio.run(go_async(url)) if use_async else go_sync(url))
        except BaseException as exc:
            results.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["aiosqlite", "pysqlite"])
def test_processes_opening_a_new_file_at_once_all_connect_in_wal_mode(
    tmp_path: Path, driver: str
) -> None:
    ctx = fork_server()
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    tasks = [ctx.Queue() for _ in range(PROCESSES)]
    procs = [ctx.Process(target=_opener, args=(driver == "aiosqlite", t, barrier, results),
                         daemon=True) for t in tasks]
    for p in procs:
        p.start()
    failures: list[str] = []
    try:
        for r in range(ROUNDS):
            for t in tasks:  # a new file each round
                t.put(f"sqlite:///{tmp_path}/new-{r}.db")
            modes = [results.get(timeout=120) for _ in procs]
            failures += [f"round {r}: {m}" for m in modes if m != "wal"]
    finally:
        for t in tasks:
            t.put(None)
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert failures == []
