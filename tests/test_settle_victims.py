"""A flush whose settle the database chose as a deadlock's victim is written again at once
(``Flusher._flush_locked``, up to ``VICTIM_TRIES`` in a row), not after the backoff and
its warning: the database rolled the settle back whole, so nothing was written and
nothing is in doubt. The failures are the drivers' own exceptions, raised into the real
engine on the real databases; a settle that goes on failing so backs off as before and
loses nothing."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from sqlmq import Broker, Message
from sqlmq.runtime.flusher import VICTIM_TRIES

from .conftest import rows, wait_for_count
from .test_acquire_parts import _victim

QUICK = {"flush_interval": 0.01, "max_fetch_interval": 0.05}


def _failing(call: Callable[..., Awaitable[Any]], exc: BaseException, times: int,
             calls: list[int]) -> Callable[..., Awaitable[Any]]:
    """``call``, raising ``exc`` instead the first ``times`` times."""
    async def failing(*args: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:
            raise exc
        return await call(*args)
    return failing


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "sqlmq" and r.levelno == level]


async def _handle_all(broker: Broker, n: int, **publish: Any) -> tuple[list[int], Any]:
    """Publish ``n`` messages, handle them; the ids published and the runtime."""
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
    return sent, runtime


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_a_settle_chosen_as_a_deadlocks_victim_is_written_again_at_once(
        broker: Broker, db_kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sqlmq")
    engine: Any = broker.engine
    calls: list[int] = []
    engine.settle = _failing(engine.settle, _victim(db_kind), 1, calls)
    sent, runtime = await _handle_all(broker, 3)
    assert sorted(r["id"] for r in await rows(broker, "archive")) == sorted(sent)
    assert (runtime.counters.completed, runtime.counters.stale) == (3, 0)
    assert any(f"deadlock's victim; writing it again (2 of {VICTIM_TRIES})" in line
               for line in _lines(caplog, logging.INFO))
    assert _lines(caplog, logging.WARNING) == []  # no backoff, and nothing in doubt


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_a_passing_settle_chosen_as_a_victim_passes_the_slot_on_when_written_again(
        broker: Broker, db_kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sqlmq")
    await broker.set_channel("c", max_concurrency=1)
    engine: Any = broker.engine
    calls: list[int] = []
    engine.settle_passing = _failing(engine.settle_passing, _victim(db_kind), 1, calls)
    sent, runtime = await _handle_all(broker, 4, channel="c")
    assert sorted(r["id"] for r in await rows(broker, "archive")) == sorted(sent)
    assert runtime.counters.passed >= 1 and len(calls) >= 2
    assert _lines(caplog, logging.WARNING) == []


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_a_settle_that_keeps_deadlocking_backs_off_and_loses_nothing(
        broker: Broker, db_kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sqlmq")
    engine: Any = broker.engine
    calls: list[int] = []
    engine.settle = _failing(engine.settle, _victim(db_kind), VICTIM_TRIES + 1, calls)
    sent, runtime = await _handle_all(broker, 3)
    assert sorted(r["id"] for r in await rows(broker, "archive")) == sorted(sent)
    assert runtime.counters.completed == 3
    # VICTIM_TRIES tries in a row (all but the first at once), then the backoff and its
    # warning; the flush after it fails once more, tries again at once, and is written.
    assert sum("deadlock's victim" in line for line in _lines(caplog, logging.INFO)) == \
        (VICTIM_TRIES - 1) + 1
    assert any("flush" in line for line in _lines(caplog, logging.WARNING))
