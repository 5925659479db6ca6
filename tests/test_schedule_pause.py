"""Pausing and resuming a periodic schedule through the broker, on every engine: a paused
schedule publishes no tick while its process runs, ticks again once resumed, and the
ticks it missed meanwhile follow its ``catch_up`` (no burst unless it asks for "all").
The engine rules are ``tests/contract/test_schedule_pause.py``; the CLI's ``schedules
--pause`` is tested here too."""

from __future__ import annotations

import asyncio
import json

import pytest

from sqlmq import Broker, UnknownSchedule

from .conftest import on_every_engine, rows, run_cli, wait_until
from .test_periodic import _count, _interval_not_near_a_tick, _missed, ticks_of


@on_every_engine
async def test_a_paused_schedule_publishes_no_tick_and_ticks_again_once_resumed(
        broker: Broker) -> None:
    broker.periodic("beat", every=0.1, body="beat", catch_up="none")
    await broker.start()
    try:
        await wait_until(lambda: _count(broker, "beat", 2), timeout=10, message="two ticks")
        assert await broker.pause_schedule("beat") is True
        before = len(await rows(broker, queue="beat"))
        await asyncio.sleep(0.6)  # six ticks of the cadence
        assert len(await rows(broker, queue="beat")) == before
        (info,) = await broker.schedules()
        assert info.paused
        assert await broker.resume_schedule("beat") is True
        await wait_until(lambda: _count(broker, "beat", before + 2), timeout=10,
                         message="two ticks after the resume")
    finally:
        await broker.stop()


@on_every_engine
@pytest.mark.parametrize(("catch_up", "published"), [("latest", 1), ("all", 4), ("none", 0)])
async def test_the_ticks_missed_while_paused_follow_the_catch_up_policy(
        broker: Broker, catch_up: str, published: int) -> None:
    interval = _interval_not_near_a_tick(await broker.engine.now())
    schedule = broker.periodic("late", every=interval, body=b"x", catch_up=catch_up)
    await broker.engine.register_schedule(schedule)
    await broker.pause_schedule("late")
    latest = await _missed(broker, "late", interval, missed=4)
    await broker.start()
    try:
        ticker = broker._ticker
        assert ticker is not None
        await wait_until(lambda: ticker.rounds >= 1, timeout=10, message="a round")
        assert await rows(broker, queue="late") == []  # paused: nothing, whatever is due
        rounds = ticker.rounds
        await broker.resume_schedule("late")  # wakes the ticker at once
        await wait_until(lambda: ticker.rounds > rounds, timeout=10, message="a round")
    finally:
        await broker.stop()
    ticks = ticks_of(await rows(broker, queue="late"))
    assert ticks == [latest - i * interval for i in range(published)][::-1]


@on_every_engine
async def test_an_unknown_schedule_is_named_and_a_repeated_pause_changes_nothing(
        broker: Broker) -> None:
    await broker.engine.register_schedule(broker.periodic("nightly", cron="0 3 * * *", body=1))
    with pytest.raises(UnknownSchedule, match=r"no schedule named 'nope' \(schedules: "
                                              r"'nightly'\)"):
        await broker.pause_schedule("nope")
    with pytest.raises(UnknownSchedule):
        await broker.resume_schedule("nope")
    assert await broker.resume_schedule("nightly") is False
    assert await broker.pause_schedule("nightly") is True
    assert await broker.pause_schedule("nightly") is False


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_the_schedules_command_pauses_and_resumes(
        broker: Broker, db_url: str, prefix: str) -> None:
    await broker.engine.register_schedule(broker.periodic("nightly", cron="0 3 * * *", body=1))
    where = ("--url", db_url, "--prefix", prefix)

    async def cli(*args: str) -> tuple[int, str, str]:
        done = await asyncio.to_thread(run_cli, "schedules", *args, *where)
        return done.returncode, done.stdout, done.stderr

    code, out, _ = await cli("--pause", "nightly")
    assert code == 0 and "paused schedule 'nightly'" in out
    code, out, _ = await cli("--json")
    (listed,) = json.loads(out)
    assert listed["paused_at"] is not None and listed["next_tick"] is None
    code, out, _ = await cli()
    assert out.splitlines()[1].split("\t")[-1].startswith("paused since ")
    code, out, _ = await cli("--resume", "nightly")
    assert code == 0 and "resumed schedule 'nightly'" in out
    (info,) = await broker.schedules()
    assert not info.paused
    code, _, err = await cli("--resume", "nope")
    assert code == 1 and "no schedule named 'nope' (schedules: 'nightly')" in err
    code, _, err = await cli("--pause", "nightly", "--delete", "nightly")
    assert code == 2 and "give one of --pause, --resume and --delete" in err
