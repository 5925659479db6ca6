"""Periodic schedules through the engine contract, on every engine: registration, the
listing, and publishing a tick exactly once (later ticks only; nothing when the body fails)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from sqlmq import Cadence, Schedule
from sqlmq.engines.contract import Engine
from sqlmq.records import NewMessages

from .conftest import Env, msg


def schedule(name: str = "s", every: float = 60.0, queue: str = "q",
             catch_up: str = "latest") -> Schedule:
    return Schedule(name, queue, Cadence(every=every), b"x", catch_up)  # type: ignore[arg-type]


def producing(payload: bytes = b"tick", queue: str = "q") -> tuple[list[int], object]:
    calls: list[int] = []

    async def produce() -> NewMessages:
        calls.append(1)
        return NewMessages.of([msg(queue, payload)])

    return calls, produce


async def test_register_keeps_the_first_registration_until_the_cadence_changes(
        env: Env, engine: Engine) -> None:
    first = await engine.register_schedule(schedule())
    assert (first.name, first.queue, first.cadence, first.catch_up) == (
        "s", "q", Cadence(every=60), "latest")
    assert first.last_tick_at is None and first.last_message_id is None
    now = await engine.now()
    assert abs((now - first.registered_at).total_seconds()) < 5
    await env.passes(0.05)
    again = await engine.register_schedule(schedule(queue="q2", catch_up="all"))
    assert again.registered_at == first.registered_at  # same cadence: same history
    assert (again.queue, again.catch_up) == ("q2", "all")
    changed = await engine.register_schedule(schedule(every=30))
    assert changed.registered_at > first.registered_at and changed.cadence == Cadence(every=30)
    cron = await engine.register_schedule(
        Schedule("c", "q", Cadence(cron="0 3 * * *", tz="Europe/Paris"), b"x"))
    assert cron.cadence == Cadence(cron="0 3 * * *", tz="Europe/Paris")
    assert [s.name for s in await engine.schedules()] == ["c", "s"]


async def test_a_tick_is_published_once_and_never_an_earlier_one(
        env: Env, engine: Engine) -> None:
    info = await engine.register_schedule(schedule())
    tick = Cadence(every=60).after(info.registered_at)
    calls, produce = producing()
    msg_id = await engine.fire_tick("s", tick, produce)  # type: ignore[arg-type]
    assert msg_id is not None and len(calls) == 1
    (delivery,) = await engine.acquire(["q"], 10, 30.0)
    assert (delivery.id, delivery.payload) == (msg_id, b"tick")
    for again in (tick, tick - timedelta(minutes=1)):
        assert await engine.fire_tick("s", again, produce) is None  # type: ignore[arg-type]
    assert len(calls) == 1  # a tick taken is not made again
    (listed,) = await engine.schedules()
    assert (listed.last_tick_at, listed.last_message_id) == (tick, msg_id)
    later = await engine.fire_tick("s", tick + timedelta(minutes=1), produce)  # type: ignore[arg-type]
    assert later is not None and later > msg_id


async def test_concurrent_firings_of_one_tick_publish_one_message(env: Env,
                                                                  engine: Engine) -> None:
    info = await engine.register_schedule(schedule())
    tick = Cadence(every=60).after(info.registered_at)
    calls, produce = producing()
    fired = await asyncio.gather(*(engine.fire_tick("s", tick, produce)  # type: ignore[arg-type]
                                   for _ in range(5)))
    assert len([f for f in fired if f is not None]) == 1 and len(calls) == 1
    assert (await env.stats("q")).pending == 1


async def test_a_failing_body_publishes_nothing_and_leaves_the_tick(env: Env,
                                                                    engine: Engine) -> None:
    info = await engine.register_schedule(schedule())
    tick = Cadence(every=60).after(info.registered_at)

    async def broken() -> NewMessages:
        raise RuntimeError("report service down")

    with pytest.raises(RuntimeError, match="report service down"):
        await engine.fire_tick("s", tick, broken)
    (listed,) = await engine.schedules()
    assert listed.last_tick_at is None and (await env.stats("q")).pending == 0
    _, produce = producing()
    assert await engine.fire_tick("s", tick, produce) is not None  # type: ignore[arg-type]


async def test_unknown_and_deleted_schedules_publish_nothing(env: Env, engine: Engine) -> None:
    calls, produce = producing()
    now = await engine.now()
    assert await engine.fire_tick("nobody", now, produce) is None  # type: ignore[arg-type]
    await engine.register_schedule(schedule())
    assert await engine.delete_schedule("s") is True
    assert await engine.delete_schedule("s") is False
    assert await engine.fire_tick("s", now, produce) is None  # type: ignore[arg-type]
    assert calls == [] and await engine.schedules() == []
