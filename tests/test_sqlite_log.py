"""SQLite's write-ahead log under steady load (``sqlmq/engines/sqlite/log.py``): an engine
lets its next writer in when the previous one sends its COMMIT, so the checkpoint after a
commit never finds the log free to start over, and its file grew with every message
handled (149 MB through a drain of 20,000 messages of 1,000 ordered channels). Past its
limit, the engine truncates it after a transaction, inside its write turn."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sqlmq import Broker, Outcome, Settlement
from sqlmq.engines.sqlite import log as sqlite_log

LIMIT = 64 * 1024


def _log(db_url: str) -> Path:
    return Path(db_url.removeprefix("sqlite:///") + "-wal")


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_log_past_its_limit_is_truncated_after_the_next_settle(
    broker: Broker, db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sqlite_log, "LOG_LIMIT", LIMIT)
    sent = await broker.publish_batch("jobs", [b"x" * 200] * 2000)
    assert _log(db_url).stat().st_size > LIMIT, "the log stayed short: the test proves nothing"
    engine: Any = broker.engine
    taken = await engine.acquire(["jobs"], 10, 30)
    assert await engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE)
                                for d in taken]) == {d.id for d in taken}
    assert _log(db_url).stat().st_size == 0
    assert [s.pending for s in await broker.stats() if s.queue == "jobs"] == [len(sent) - 10]


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_a_truncation_kept_waiting_by_another_reader_gives_up_and_loses_nothing(
    broker: Broker, db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another connection reading an older snapshot keeps the log from being truncated:
    the engine waits 50 ms at most, goes on (the settle has committed), and tries again
    later; once the reader is gone, the next try truncates it."""
    monkeypatch.setattr(sqlite_log, "LOG_LIMIT", LIMIT)
    monkeypatch.setattr(sqlite_log, "RETRY_AFTER", 0.0)
    await broker.publish_batch("jobs", [b"x" * 200] * 2000)
    reader = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
    engine: Any = broker.engine
    try:
        reader.execute("BEGIN")
        reader.execute(f"SELECT count(*) FROM {broker.schema.message.name}").fetchone()
        first = await engine.acquire(["jobs"], 10, 30)
        await engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE) for d in first])
        assert _log(db_url).stat().st_size > LIMIT
    finally:
        reader.rollback()
        reader.close()
    second = await engine.acquire(["jobs"], 10, 30)
    await engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE) for d in second])
    assert _log(db_url).stat().st_size == 0
    assert [s.pending for s in await broker.stats() if s.queue == "jobs"] == [1980]


def test_tries_that_give_up_are_spaced_out_doubling(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader elsewhere that keeps the log from being truncated would cost the engine's
    writers 50 ms every try: the pause after each try that gave up doubles, up to
    RETRY_MOST, and a truncation that completes ends it."""
    monkeypatch.setattr(sqlite_log, "LOG_LIMIT", LIMIT)
    (tmp_path / "q.db-wal").write_bytes(b"\0" * (LIMIT + 1))
    now = [100.0]
    bound = sqlite_log.LogBound(str(tmp_path / "q.db"), clock=lambda: now[0])
    assert bound.due()
    pauses = []
    for _ in range(10):
        bound.ran(busy=True)
        start = now[0]
        while not bound.due():
            now[0] += 0.125
        pauses.append(now[0] - start)
    assert pauses[:4] == [0.25, 0.5, 1.0, 2.0] and pauses[-1] == sqlite_log.RETRY_MOST
    bound.ran(busy=False)
    assert bound.due()
    assert not sqlite_log.LogBound(":memory:").due()
