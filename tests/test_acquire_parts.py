"""An acquire is two transactions once channels exist (the plain messages', the channels'):
a part the database chose as a deadlock's victim runs again at once, and a second part
that fails otherwise does not lose what the first took (``ChannelStatements.acquire``).
The failures are the drivers' own exceptions, raised once into the real engine on the
real databases."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncmy.errors
import asyncpg
import pytest

from sqlmq import Broker


def _victim(db_kind: str) -> BaseException:
    """The error each database's driver raises when its transaction is a deadlock's
    victim."""
    if db_kind == "postgresql":
        return asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
    return asyncmy.errors.OperationalError(
        1213, "Deadlock found when trying to get lock; try restarting transaction")


def _failing(call: Callable[..., Awaitable[Any]], exc: BaseException, calls: list[int],
             times: int = 1) -> Callable[..., Awaitable[Any]]:
    """``call``, raising ``exc`` instead the first ``times`` times (``calls``: one entry per
    call)."""
    async def failing(*args: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:
            raise exc
        return await call(*args)
    return failing


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_an_acquire_chosen_as_a_deadlocks_victim_runs_again(
        broker: Broker, db_kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sqlmq")
    sent = await broker.publish_batch("jobs", range(3))
    engine: Any = broker.engine
    calls: list[int] = []
    engine._acquire_plain = _failing(engine._acquire_plain, _victim(db_kind), calls)
    got = await engine.acquire(["jobs"], 10, 30)
    assert sorted(d.id for d in got) == sorted(sent) and len(calls) == 2
    assert any("deadlock's victim; running it again (2 of 3)" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_an_acquire_that_keeps_deadlocking_raises_after_its_tries(
        broker: Broker, db_kind: str) -> None:
    await broker.publish("jobs", "x")
    engine: Any = broker.engine
    victim = _victim(db_kind)

    async def always(*args: Any) -> Any:
        raise victim

    engine._acquire_plain = always
    with pytest.raises(type(victim)):
        await engine.acquire(["jobs"], 10, 30)


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
async def test_what_the_first_part_took_is_returned_when_the_second_fails(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sqlmq")
    await broker.set_channel("c", max_concurrency=1)
    plain = await broker.publish_batch("jobs", range(3))
    await broker.publish("jobs", "in a channel", channel="c")
    engine: Any = broker.engine
    calls: list[int] = []
    engine._acquire_channels = _failing(engine._acquire_channels,
                                             ConnectionResetError("connection lost"), calls)
    engine._channels_first = True  # the next acquire goes plain first
    got = await engine.acquire(["jobs"], 10, 30)
    assert sorted(d.id for d in got) == sorted(plain) and calls == [1]
    assert any("took 3 message(s), then failed (ConnectionResetError: connection lost)"
               in r.getMessage() for r in caplog.records)
    # what failed is the next acquire's
    (channel_message,) = await engine.acquire(["jobs"], 10, 30)
    assert channel_message.channel == "c"


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql", "mariadb"])
async def test_a_second_part_failing_after_a_first_that_took_nothing_raises(
        broker: Broker) -> None:
    await broker.set_channel("c", max_concurrency=1)
    await broker.publish("jobs", "in a channel", channel="c")
    engine: Any = broker.engine
    calls: list[int] = []
    engine._acquire_channels = _failing(engine._acquire_channels,
                                             ConnectionResetError("connection lost"), calls)
    engine._channels_first = True
    with pytest.raises(ConnectionResetError):
        await engine.acquire(["jobs"], 10, 30)
