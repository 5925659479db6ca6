"""Periodic schedules through the broker, on every engine: one message per tick with the
body and headers the schedule makes, shared by brokers that run the same schedule, catch-up
after missed ticks by each policy, a failing body logged and retried, and bad schedules
refused at registration. The engine rules are ``tests/contract/test_schedules.py``; three OS
processes are ``tests/test_periodic_processes.py``."""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from sqlmq import (
    Broker,
    Cadence,
    ConfigurationError,
    EncodeError,
    Message,
    PayloadTooLarge,
    PublishError,
)
from sqlmq.engines.memory.engine import MemoryEngine
from sqlmq.schedules import ON_TIME

from .conftest import on_every_engine, rows, sibling, wait_until

pytestmark = on_every_engine


def ticks_of(found: list[Any]) -> list[datetime]:
    return sorted(datetime.fromisoformat(headers_of(r)["tick"]) for r in found)


def headers_of(row: Any) -> dict[str, str]:
    h = row["headers"]
    return json.loads(h) if isinstance(h, str) else h


async def published_ticks(broker: Broker, queue: str) -> list[datetime]:
    """The ticks of every message published to ``queue``, waiting or archived."""
    return ticks_of(await rows(broker, queue=queue) + await rows(broker, "archive", queue=queue))


def consecutive(ticks: list[datetime], step: timedelta) -> bool:
    return all(b - a == step for a, b in itertools.pairwise(ticks))


# The timed tests use catch_up="all": on a loaded machine a round may come after the next
# tick, and "latest" would then rightly skip one; "all" publishes it late instead.


async def test_every_tick_publishes_one_message_made_by_the_function(broker: Broker) -> None:
    got: list[Message] = []

    @broker.periodic("report", every=timedelta(milliseconds=200), queue="reports",
                     catch_up="all")
    def report(tick: datetime) -> dict[str, str]:
        return {"for": tick.isoformat()}

    @broker.subscriber("reports")
    async def handle(msg: Message) -> None:
        got.append(msg)

    await broker.start()
    await wait_until(lambda: len(got) >= 5, timeout=10, message="five ticks")
    await broker.stop()
    ticks = await published_ticks(broker, "reports")
    assert len(ticks) == len(set(ticks)) and consecutive(ticks, timedelta(milliseconds=200))
    assert {datetime.fromisoformat(m.headers["tick"]) for m in got} <= set(ticks)
    assert all(m.headers["schedule"] == "report" and m.body == {"for": m.headers["tick"]}
               for m in got)
    (info,) = await broker.schedules()
    assert info.last_tick_at == ticks[-1] and info.queue == "reports"


async def test_brokers_running_one_schedule_publish_each_tick_once(
        broker: Broker, db_url: str, prefix: str) -> None:
    others = [sibling(broker, db_url, prefix) for _ in range(2)]
    for b in (broker, *others):
        b.periodic("beat", every=0.1, body="beat", catch_up="all")
    for b in (broker, *others):
        await b.start()
    try:
        await wait_until(lambda: _count(broker, "beat", 8), timeout=10, message="eight ticks")
    finally:
        for b in (broker, *others):
            await b.stop()
        for b in others:
            if not isinstance(broker.engine, MemoryEngine):
                await b.close()
    ticks = await published_ticks(broker, "beat")
    assert len(ticks) == len(set(ticks)) >= 8 and consecutive(ticks, timedelta(milliseconds=100))


async def _count(broker: Broker, queue: str, at_least: int) -> bool:
    return len(await rows(broker, queue=queue)) >= at_least


async def _missed(broker: Broker, name: str, interval: timedelta, missed: int) -> datetime:
    """Make the schedule ``name`` look as if its processes stopped ``missed`` ticks ago:
    registered long before, its last tick ``missed`` ticks before the latest. Returns the
    latest tick."""
    now = await broker.engine.now()
    latest = Cadence(every=interval.total_seconds()).latest(now)
    last = latest - missed * interval
    values = {"registered_at": last - interval, "last_tick_at": last}
    engine = broker.engine
    if isinstance(engine, MemoryEngine):
        with engine._lock:
            engine._store.schedules[name] = replace(engine._store.schedules[name], **values)
    else:
        s = broker.schema.schedule
        async with broker.db.begin() as conn:
            await conn.execute(update(s).where(s.c.name == name).values(**values))
    return latest


def _interval_not_near_a_tick(now: datetime) -> timedelta:
    """An hourly-scale interval whose latest tick is well over ON_TIME ago (so that
    ``catch_up="none"`` has nothing on time to publish during the test) and whose next tick
    is well after the test (a run at 05:59:59 saw the 06:00 tick of an hourly schedule
    come due in the middle of it)."""
    for hours in (3, 5, 7):
        interval = timedelta(hours=hours)
        latest = Cadence(every=interval.total_seconds()).latest(now)
        if now - latest > ON_TIME * 6 and latest + interval - now > ON_TIME * 6:
            return interval
    raise AssertionError("unreachable: three coprime intervals cannot all tick within a "
                         "minute of now")


@pytest.mark.parametrize(("catch_up", "published"), [("latest", 1), ("all", 4), ("none", 0)])
async def test_a_start_after_missed_ticks_follows_the_catch_up_policy(
        broker: Broker, catch_up: str, published: int) -> None:
    interval = _interval_not_near_a_tick(await broker.engine.now())
    schedule = broker.periodic("late", every=interval, body=b"x", catch_up=catch_up)
    await broker.engine.register_schedule(schedule)
    latest = await _missed(broker, "late", interval, missed=4)
    await broker.start()
    ticker = broker._ticker
    assert ticker is not None
    await wait_until(lambda: ticker.rounds >= 1, timeout=10, message="a round of the ticker")
    await broker.stop()
    ticks = ticks_of(await rows(broker, queue="late"))
    assert ticks == [latest - i * interval for i in range(published)][::-1]


async def test_a_failing_body_is_logged_and_its_tick_published_later(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[datetime] = []
    interval = _interval_not_near_a_tick(await broker.engine.now())

    @broker.periodic("flaky", every=interval, catch_up="latest")
    def flaky(tick: datetime) -> str:
        calls.append(tick)
        if len(calls) == 1:
            raise RuntimeError("upstream down")
        return "ok"

    broker.periodic("steady", every=interval, body="fine")
    for name in ("flaky", "steady"):
        await broker.engine.register_schedule(
            next(s for s in broker.periodic_schedules if s.name == name))
        await _missed(broker, name, interval, missed=1)
    with caplog.at_level(logging.ERROR, logger="sqlmq"):
        await broker.start()
        await wait_until(lambda: _count(broker, "flaky", 1), timeout=10,
                         message="the tick published after the failure")
    await broker.stop()
    assert len(calls) == 2 and calls[0] == calls[1]  # the same tick, tried again
    (record,) = [r for r in caplog.records if "could not publish" in r.getMessage()]
    assert "schedule 'flaky'" in record.getMessage() and "upstream down" in record.getMessage()
    assert record.exc_info is not None  # with its traceback
    assert len(await rows(broker, queue="steady")) == 1  # the other schedule went on


async def test_a_schedule_added_after_start_runs(broker: Broker) -> None:
    await broker.start()
    broker.periodic("later", every=0.1, body=1)
    await wait_until(lambda: _count(broker, "later", 2), timeout=10, message="two ticks")
    await broker.stop()


async def test_the_schedules_are_listed_as_soon_as_start_returns(broker: Broker) -> None:
    """docs/scheduling.md lists ``broker.schedules()`` right after ``start()``: on a fresh
    database the rows must be written by then, not by the loop's first round."""
    broker.periodic("nightly", cron="0 3 * * *", body="report", queue="reports")

    @broker.periodic("cleanup", every=timedelta(hours=1), catch_up="none")
    def cleanup() -> str:
        return "sweep"

    await broker.start()
    try:
        listed = [(s.name, s.queue) for s in await broker.schedules()]
    finally:
        await broker.stop()
    assert listed == [("cleanup", "cleanup"), ("nightly", "reports")]


async def test_bad_schedules_are_refused_at_registration(broker: Broker) -> None:
    broker.periodic("once", every=1, body=1)
    with pytest.raises(ConfigurationError, match="schedule 'once' is registered twice"):
        broker.periodic("once", every=2, body=1)
    with pytest.raises(EncodeError):
        broker.periodic("odd", every=1, body=object())
    with pytest.raises(PayloadTooLarge):
        broker.periodic("big", every=1, body=b"x" * (broker.max_payload_bytes + 1))
    with pytest.raises(ConfigurationError, match="decorates a function that makes the body"):
        broker.periodic("notfn", every=1)("not a function")
    with pytest.raises(ConfigurationError, match="unknown time zone 'Nowhere'"):
        broker.periodic("tz", cron="0 3 * * *", tz="Nowhere")
    with pytest.raises(PublishError, match="header 'k' must be a string"):
        broker.periodic("h", every=1, body=1, headers={"k": 5})  # type: ignore[dict-item]
    with pytest.raises(PublishError, match="headers must be a mapping of str to str, got list"):
        broker.periodic("l", every=1, body=1, headers=[("k", "v")])  # type: ignore[arg-type]
    assert [s.name for s in broker.periodic_schedules] == ["once"]
