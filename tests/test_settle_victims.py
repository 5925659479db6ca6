"""A flush whose settle the database chose as a deadlock's victim is written again at once
(``Flusher._flush_locked``, up to ``VICTIM_TRIES`` in a row), not after the backoff and
its warning: the database rolled the settle back whole, so nothing was written and
nothing is in doubt. The failures are the drivers' own exceptions, raised into the real
engine on the real databases; a settle that goes on failing so backs off as before and
loses nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sqlmq import Broker, Message
from sqlmq.runtime.flusher import VICTIM_TRIES

from .conftest import rows, wait_for_count
from .test_acquire_parts import _failing, _victim

QUICK = {"flush_interval": 0.01, "max_fetch_interval": 0.05}


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "sqlmq" and r.levelno == level]


def _failing_for(broker: Broker, method: str, db_kind: str, times: int) -> list[int]:
    """Make the engine's ``method`` raise the driver's deadlock error its first ``times``
    calls; the list its calls are counted in."""
    engine: Any = broker.engine
    calls: list[int] = []
    setattr(engine, method, _failing(getattr(engine, method), _victim(db_kind), calls, times))
    return calls


async def _handle_all(broker: Broker, n: int, **publish: Any) -> Any:
    """Publish ``n`` messages, handle them, see each archived; the runtime."""
    handled: list[int] = []

    @broker.subscriber("jobs", workers=2, **QUICK)
    async def handle(msg: Message) -> None:
        handled.append(msg.id)

    sent = await broker.publish_batch("jobs", range(n), **publish)
    await broker.start()
    await wait_for_count(lambda: len(handled), n, message="handled")
    (runtime,) = broker.runtimes
    await wait_for_count(lambda: runtime.counters.completed, n, message="written")
    await broker.stop()
    assert sorted(r["id"] for r in await rows(broker, "archive")) == sorted(sent)
    return runtime


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_a_settle_chosen_as_a_deadlocks_victim_is_written_again_at_once(
        broker: Broker, db_kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sqlmq")
    _failing_for(broker, "settle", db_kind, 1)
    runtime = await _handle_all(broker, 3)
    assert (runtime.counters.completed, runtime.counters.stale) == (3, 0)
    assert any(f"deadlock's victim; writing it again (2 of {VICTIM_TRIES})" in line
               for line in _lines(caplog, logging.INFO))
    assert _lines(caplog, logging.WARNING) == []  # no backoff, and nothing in doubt


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_a_passing_settle_chosen_as_a_victim_passes_the_slot_on_when_written_again(
        broker: Broker, db_kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sqlmq")
    await broker.set_channel("c", max_concurrency=1)
    calls = _failing_for(broker, "settle_passing", db_kind, 1)
    runtime = await _handle_all(broker, 4, channel="c")
    assert runtime.counters.passed >= 1 and len(calls) >= 2
    assert _lines(caplog, logging.WARNING) == []


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_a_settle_that_keeps_deadlocking_backs_off_and_loses_nothing(
        broker: Broker, db_kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sqlmq")
    _failing_for(broker, "settle", db_kind, VICTIM_TRIES + 1)
    runtime = await _handle_all(broker, 3)
    assert runtime.counters.completed == 3
    # VICTIM_TRIES tries in a row (all but the first at once), then the backoff and its
    # warning; the flush after it fails once more, tries again at once, and is written.
    assert sum("deadlock's victim" in line for line in _lines(caplog, logging.INFO)) == \
        (VICTIM_TRIES - 1) + 1
    assert any("flush" in line for line in _lines(caplog, logging.WARNING))
