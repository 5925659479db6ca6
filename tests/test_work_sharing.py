"""Work sharing: separate OS processes drain one queue, and each message is handled and
archived exactly once (SKIP LOCKED on the servers, BEGIN IMMEDIATE on a shared SQLite file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from sqlmq import Broker

from .conftest import wait_until
from .procs import handled_ids, ready_marker, spawn_worker, terminate, worker_log

PROCESSES = 3
MESSAGES = 10_000


async def count(broker: Broker, table: str) -> int:
    t = broker.schema.archive if table == "archive" else broker.schema.message
    async with broker.db.connect() as conn:
        return (await conn.execute(select(func.count()).select_from(t))).scalar_one()


async def test_processes_sharing_a_queue_handle_and_archive_each_message_exactly_once(
    broker: Broker, db_url: str, prefix: str, tmp_path: Path
) -> None:
    await _share(broker, db_url, prefix, tmp_path, sleep=0.002)


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_no_process_sharing_an_sqlite_file_is_starved_by_quick_writers(
    broker: Broker, db_url: str, prefix: str, tmp_path: Path
) -> None:
    """Handlers that take no time: the other processes' writers then hold SQLite's write
    lock almost without a break. Waiting on SQLite's busy handler (up to 100 ms between
    tries), a process went whole drains without a turn: in 4 of 5 runs one handled none."""
    await _share(broker, db_url, prefix, tmp_path, sleep=0.0)


async def _share(broker: Broker, db_url: str, prefix: str, tmp_path: Path,
                 sleep: float) -> None:
    outs = [tmp_path / f"worker{i}.ids" for i in range(PROCESSES)]
    procs = [spawn_worker(db_url, prefix, "shared", out, sleep=sleep) for out in outs]
    try:
        await wait_until(lambda: all(ready_marker(o).exists() for o in outs), timeout=60,
                         message="every worker process running its subscriber")
        published = await broker.publish_batch("shared", range(MESSAGES))
        await wait_until(lambda: _archived_all(broker), timeout=180, interval=0.2,
                         message=f"{MESSAGES} messages archived")
    finally:
        codes = [terminate(p) for p in procs]
    assert codes == [0] * PROCESSES, [worker_log(o) for o in outs]

    per_process = [handled_ids(o) for o in outs]
    every = [i for ids in per_process for i in ids]
    assert len(every) == MESSAGES, "a message was handled twice (or not at all)"
    assert sorted(every) == sorted(published)
    assert all(per_process), f"a process got no work: {[len(ids) for ids in per_process]}"

    archive = broker.schema.archive
    async with broker.db.connect() as conn:
        summary = (
            await conn.execute(
                select(archive.c.state, archive.c.deliveries_count, func.count())
                .group_by(archive.c.state, archive.c.deliveries_count)
            )
        ).all()
    assert [tuple(r) for r in summary] == [("COMPLETED", 1, MESSAGES)]
    assert await count(broker, "message") == 0


async def _archived_all(broker: Broker) -> bool:
    return await count(broker, "archive") >= MESSAGES
