"""The live workers registry: a broker running subscribers keeps a row of ``{prefix}worker``
fresh (host, pid, version, its subscribers and their settings, what it runs and holds),
deletes it when it stops, and a process killed without stopping ages out: it is no longer
listed once its row's ``expires_at`` passes, and the next heartbeat of any broker deletes
the row. On every engine, and with real OS processes on every database."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from sqlmq import Broker, ConfigurationError, Message, WorkerInfo
from sqlmq.maintenance.heartbeat import MISSED_BEATS, sqlmq_version

from .conftest import on_every_engine, on_memory, sibling, wait_until
from .procs import ready_marker, spawn_worker, terminate, worker_log


async def _listed(broker: Broker, worker_id: str | None) -> WorkerInfo | None:
    return next((w for w in await broker.workers() if w.id == worker_id), None)


async def _rows(broker: Broker) -> list[Any]:
    """The registry's rows as stored, dead ones included (ids, pids)."""
    if on_memory(broker):
        return [(w.id, w.pid) for w in broker.engine._store.workers.values()]  # type: ignore[attr-defined]
    w = broker.schema.worker
    async with broker.db.connect() as conn:
        return [tuple(r) for r in await conn.execute(select(w.c.id, w.c.pid))]


@on_every_engine
async def test_a_running_broker_is_listed_with_its_subscribers_and_counts_until_it_stops(
        broker: Broker) -> None:
    release = asyncio.Event()
    broker.heartbeat_interval = 0.1  # counts show within a few beats

    @broker.subscriber("jobs", workers=3, fetch_batch=5, prefetch=7, lease=12.0,
                       max_fetch_interval=0.05)
    async def slow(msg: Message) -> None:
        await release.wait()

    assert await broker.workers() == [] and broker.worker_id is None
    await broker.start()
    try:
        me = broker.worker_id
        assert me is not None
        found = await _listed(broker, me)  # listed once start() returns
        assert found is not None
        assert (found.host, found.pid, found.version) == (
            socket.gethostname(), os.getpid(), sqlmq_version())
        assert found.started_at <= found.heartbeat_at < found.expires_at
        (sub,) = found.subscribers
        assert sub["queues"] == ["jobs"] and sub["handler"].endswith(".slow")
        assert (sub["workers"], sub["fetch_batch"], sub["prefetch"], sub["lease"]) == (
            3, 5, 7, 12.0)
        assert (found.running, found.held) == (0, 0)

        await broker.publish_batch("jobs", list(range(5)))

        async def three_running_two_held() -> bool:
            w = await _listed(broker, me)
            return w is not None and (w.running, w.held) == (3, 2) and (
                w.subscribers[0]["running"], w.subscribers[0]["held"]) == (3, 2)

        await wait_until(three_running_two_held, message="3 handlers running, 2 held")
    finally:
        release.set()
        await broker.stop()
    assert await broker.workers() == [] and await _rows(broker) == []
    assert broker.worker_id is None


@on_every_engine
async def test_brokers_on_the_same_tables_see_each_other(
        broker: Broker, db_url: str, prefix: str) -> None:
    other = sibling(broker, db_url, prefix)
    watcher = sibling(broker, db_url, prefix)  # runs nothing: reads only
    for b, queue in ((broker, "a"), (other, "b")):
        b.subscriber(queue)(_noop)
    try:
        await broker.start()
        await other.start()
        ids = {broker.worker_id, other.worker_id}
        assert None not in ids and len(ids) == 2

        assert {w.id for w in await watcher.workers()} == ids
        queues = {w.id: w.subscribers[0]["queues"] for w in await watcher.workers()}
        assert queues == {broker.worker_id: ["a"], other.worker_id: ["b"]}
        assert {w.id for w in await broker.workers()} == ids  # and by the brokers themselves

        await other.stop()
        assert [w.id for w in await watcher.workers()] == [broker.worker_id]
    finally:
        await other.close()
        await watcher.close()


@on_every_engine
async def test_a_row_is_believed_for_its_writers_interval_not_the_readers(
        broker: Broker, db_url: str, prefix: str) -> None:
    """A broker beating every 0.1 s deletes rows that missed their beats; a broker beating
    every 30 s is not one of them, however many of the fast one's beats go by."""
    broker.heartbeat_interval = 30.0
    fast = sibling(broker, db_url, prefix, heartbeat_interval=0.1)
    broker.subscriber("slow")(_noop)
    fast.subscriber("fast")(_noop)
    try:
        await broker.start()
        await fast.start()
        await wait_until(lambda: fast._heartbeat is not None
                         and fast._heartbeat.beats > 3 * MISSED_BEATS,
                         message="the fast broker's beats")
        assert {w.id for w in await fast.workers()} == {broker.worker_id, fast.worker_id}
        assert fast._heartbeat is not None and fast._heartbeat.swept == 0
    finally:
        await fast.close()


@on_every_engine
async def test_a_failing_heartbeat_is_logged_backs_off_and_recovers(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    broker.heartbeat_interval = 0.05
    broker.subscriber("jobs")(_noop)
    real = broker.engine.heartbeat
    failures = 3

    async def flaky(beat: Any) -> int:
        nonlocal failures
        if failures:
            failures -= 1
            raise RuntimeError("registry on fire")
        return await real(beat)

    broker.engine.heartbeat = flaky  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="sqlmq")
    await broker.start()
    await wait_until(lambda: _listed(broker, broker.worker_id),
                     message="listed once the heartbeat works again")
    assert failures == 0
    failed = [r for r in caplog.records if "heartbeat" in r.getMessage()
              and "retrying with backoff" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None  # once, with its traceback
    await wait_until(lambda: any("recovered after 3 failed tries" in r.getMessage()
                                 for r in caplog.records), message="the recovery logged")
    await broker.stop()


@pytest.mark.parametrize("interval", [0, -1.0, float("nan"), "5", True, 3600])
def test_a_bad_heartbeat_interval_is_refused(interval: Any) -> None:
    with pytest.raises(ConfigurationError, match="heartbeat_interval"):
        Broker("memory://", heartbeat_interval=interval)


async def test_a_killed_worker_process_ages_out_of_the_registry(
        broker: Broker, db_url: str, prefix: str, tmp_path: Path) -> None:
    """A worker process registers, then dies by SIGKILL (no stop, no goodbye): it stays
    listed until its row expires (three of its 0.3 s beats), then it is left out, and the
    heartbeat of a broker still running deletes its row. That broker stays listed."""
    broker.heartbeat_interval = 0.3
    broker.subscriber("here")(_noop)
    out = tmp_path / "killed.ids"
    proc = spawn_worker(db_url, prefix, "there", out, heartbeat=0.3)
    try:
        await broker.start()

        async def the_process() -> WorkerInfo | None:
            return next((w for w in await broker.workers() if w.pid == proc.pid), None)

        await wait_until(lambda: ready_marker(out).exists(), timeout=60,
                         message="the worker process running")
        await wait_until(the_process, timeout=60, message="the worker process listed")
        found = await the_process()
        assert found is not None and found.subscribers[0]["queues"] == ["there"]
        assert found.host == socket.gethostname()

        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        await wait_until(lambda: _gone(the_process), timeout=60,
                         message="the killed process no longer listed")
        await wait_until(lambda: _no_row_of(broker, proc.pid), timeout=60,
                         message="the killed process's row deleted")
        assert [w.id for w in await broker.workers()] == [broker.worker_id]
    finally:
        if proc.poll() is None:
            terminate(proc)
        print(worker_log(out))


async def _gone(find: Any) -> bool:
    return await find() is None


async def _no_row_of(broker: Broker, pid: int) -> bool:
    return all(row_pid != pid for _, row_pid in await _rows(broker))


async def _noop(msg: Message) -> None:
    return None
