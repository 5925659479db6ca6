"""Pausing a periodic schedule through the engine contract, on every engine: a paused
schedule's ticks are refused (its body never made), a registration keeps the pause, and a
resumed schedule publishes again."""

from __future__ import annotations

from datetime import timedelta

from sqlmq import Cadence
from sqlmq.engines.contract import Engine

from .conftest import Env
from .test_schedules import producing, schedule


async def test_a_paused_schedule_publishes_no_tick_until_it_is_resumed(
        env: Env, engine: Engine) -> None:
    info = await engine.register_schedule(schedule())
    assert info.paused_at is None and not info.paused
    tick = Cadence(every=60).after(info.registered_at)
    calls, produce = producing()
    assert await engine.pause_schedule("s", True) is True
    assert await engine.pause_schedule("s", True) is False  # paused already
    (listed,) = await engine.schedules()
    assert listed.paused and abs((await engine.now() - listed.paused_at).total_seconds()) < 5
    assert await engine.fire_tick("s", tick, produce) is None  # type: ignore[arg-type]
    assert calls == [] and (await env.stats("q")).pending == 0
    assert await engine.pause_schedule("s", False) is True
    assert await engine.pause_schedule("s", False) is False  # not paused
    (listed,) = await engine.schedules()
    assert listed.paused_at is None and listed.last_tick_at is None
    msg_id = await engine.fire_tick("s", tick, produce)  # type: ignore[arg-type]
    assert msg_id is not None and len(calls) == 1
    (listed,) = await engine.schedules()
    assert (listed.last_tick_at, listed.last_message_id) == (tick, msg_id)


async def test_registering_a_paused_schedule_again_keeps_it_paused(
        env: Env, engine: Engine) -> None:
    """A restart or a deploy registers the schedule again, perhaps with another cadence:
    the operator's pause holds until the operator lifts it."""
    await engine.register_schedule(schedule())
    await engine.pause_schedule("s", True)
    (paused,) = await engine.schedules()
    again = await engine.register_schedule(schedule(queue="q2", catch_up="all"))
    assert again.paused_at == paused.paused_at
    await env.passes(0.05)
    changed = await engine.register_schedule(schedule(every=30))
    assert changed.registered_at > paused.registered_at and changed.paused_at == paused.paused_at
    calls, produce = producing()
    tick = Cadence(every=30).after(changed.registered_at)
    assert await engine.fire_tick("s", tick + timedelta(minutes=1), produce) is None  # type: ignore[arg-type]
    assert calls == []


async def test_pausing_an_unknown_schedule_changes_nothing(env: Env, engine: Engine) -> None:
    assert await engine.pause_schedule("nope", True) is None
    assert await engine.pause_schedule("nope", False) is None
    assert await engine.schedules() == []
