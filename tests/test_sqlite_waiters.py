"""Writers waiting for an SQLite file's write lock, made known to the writer about to take it
(``sqlmq/engines/sqlite/waiters.py``): by a shared ``flock`` on a file beside the database, seen
from another engine's descriptor, or another process's."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from sqlmq import Broker
from sqlmq.engines.sqlite import waiters as sqlite_waiters
from sqlmq.engines.sqlite.connections import waiters_of
from sqlmq.engines.sqlite.waiters import _LOOK_EVERY, STEP_BACK, Waiters


def test_a_waiting_writer_is_seen_by_another_engine_until_it_is_in(tmp_path: Path) -> None:
    database = str(tmp_path / "q.db")
    holder, waiter = Waiters(database), Waiters(database)
    assert not holder.others()
    with waiter.waiting():
        assert holder.others()
    assert not holder.others()
    assert Path(database + "-sqlmq").exists()


def test_stepping_back_ends_once_the_waiting_writer_is_in(tmp_path: Path) -> None:
    database = str(tmp_path / "q.db")
    holder, waiter = Waiters(database), Waiters(database)
    waits = waiter.waiting()
    waits.__enter__()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            waits.__exit__(None, None, None)  # the waiting writer has the lock now

    holder.step_back(sleep)
    assert slept == [_LOOK_EVERY] * 3


def test_stepping_back_is_bounded_when_the_waiting_writer_never_gets_in(
    tmp_path: Path,
) -> None:
    database = str(tmp_path / "q.db")
    holder, waiter = Waiters(database), Waiters(database)
    slept: list[float] = []
    with waiter.waiting():
        holder.step_back(lambda seconds: (slept.append(seconds), time.sleep(seconds)))
    assert slept  # it stepped back, and came back by itself after STEP_BACK
    assert len(slept) <= STEP_BACK / _LOOK_EVERY + 1


def test_nobody_steps_back_for_nothing(tmp_path: Path) -> None:
    holder = Waiters(str(tmp_path / "q.db"))
    holder.step_back(lambda seconds: pytest.fail("stepped back with nobody waiting"))


def _wait_in_child(database: str, ready: multiprocessing.Event,  # type: ignore[valid-type]
                   done: multiprocessing.Event) -> None:  # type: ignore[valid-type]
    with Waiters(database).waiting():
        ready.set()  # type: ignore[attr-defined]
        done.wait(30)  # type: ignore[attr-defined]


def test_a_writer_waiting_in_another_process_is_seen_and_a_forked_child_opens_its_own(
    tmp_path: Path,
) -> None:
    database = str(tmp_path / "q.db")
    parent = Waiters(database)
    assert not parent.others()  # opened here, before the fork
    forks = multiprocessing.get_context("fork")
    ready, done = forks.Event(), forks.Event()
    child = forks.Process(target=_wait_in_child, args=(database, ready, done))
    child.start()
    try:
        assert ready.wait(30)
        assert parent.others()
    finally:
        done.set()
        child.join(30)
    assert child.exitcode == 0
    assert not parent.others()  # a process's lock goes with it


def test_a_file_that_cannot_be_made_leaves_writers_waiting_on_their_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sqlmq")
    waiters = Waiters(str(tmp_path / "no such directory" / "q.db"))
    assert not waiters.others()
    with waiters.waiting():
        pass
    waiters.step_back(lambda seconds: pytest.fail("stepped back with nobody waiting"))
    assert "cannot be made known" in caplog.text
    assert caplog.text.count("cannot be made known") == 1


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_refused_single_publish_is_made_known_while_it_waits(
    broker: Broker, db_url: str,
) -> None:
    path = db_url.removeprefix("sqlite:///")
    await broker.publish("jobs", "first")
    watcher = Waiters(path)
    holder = sqlite3.connect(path, isolation_level=None, timeout=0)
    holder.execute("BEGIN IMMEDIATE")
    try:
        writer = asyncio.create_task(broker.publish("jobs", "waited"))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if watcher.others():
                break
        assert watcher.others(), "the waiting publish was not made known"
    finally:
        holder.commit()
        holder.close()
    await asyncio.wait_for(writer, 10)
    assert not watcher.others()
    assert waiters_of(broker.db) is not None


def test_without_flock_nobody_is_made_known_and_no_file_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sqlite_waiters, "fcntl", None)
    waiters = Waiters(str(tmp_path / "q.db"))
    with waiters.waiting():
        assert not waiters.others()
    assert not (tmp_path / "q.db-sqlmq").exists()


def test_a_database_without_a_file_has_no_waiters_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    for database in (None, ""):
        waiters = Waiters(database)
        with waiters.waiting():
            assert not waiters.others()
    assert list(tmp_path.iterdir()) == []


def test_a_relative_path_is_taken_from_the_directory_of_the_set_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    holder = Waiters("q.db")
    monkeypatch.chdir(tmp_path / "elsewhere")
    with Waiters(str(tmp_path / "q.db")).waiting():
        assert holder.others()
    assert (tmp_path / "q.db-sqlmq").exists()


def test_the_waiters_file_is_closed_with_its_engine(tmp_path: Path) -> None:
    """A process that makes and drops brokers keeps no descriptor of theirs open (the test
    suite made one per SQLite test, hundreds per worker process)."""
    def open_files() -> set[str]:
        opened = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                opened.add(os.readlink(f"/proc/self/fd/{fd}"))
        return opened

    waiters = [Waiters(str(tmp_path / f"q{i}.db")) for i in range(20)]
    for w in waiters:
        w.others()
    files = {str(tmp_path / f"q{i}.db-sqlmq") for i in range(20)}
    assert files <= open_files()
    del waiters, w
    gc.collect()
    assert not files & open_files()


def _sees_waiter_as_another_user(database: str, answer: Any) -> None:
    if os.geteuid() == 0:
        os.setuid(65534)  # nobody: the file is root's, 0644
    answer.put(Waiters(database).others())


def test_a_waiters_file_another_user_made_still_serves(tmp_path: Path) -> None:
    """Processes of other users share the file one of them made (0644, or 0444 here when
    not run as root): a descriptor opened for reading takes a flock all the same."""
    shared = Path(tempfile.mkdtemp())  # /tmp, not pytest's 0700 directory
    try:
        shared.chmod(0o755)
        database = str(shared / "q.db")
        waiter = Waiters(database)
        with waiter.waiting():
            if os.geteuid() != 0:
                os.chmod(database + "-sqlmq", 0o444)
            forks = multiprocessing.get_context("fork")
            answer = forks.Queue()
            child = forks.Process(target=_sees_waiter_as_another_user,
                                  args=(database, answer))
            child.start()
            seen = answer.get(timeout=30)
            child.join(30)
        assert child.exitcode == 0
        assert seen is True
    finally:
        shutil.rmtree(shared)
