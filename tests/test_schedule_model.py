"""The schedule model (sqlmq.schedules): which ticks a cadence has, which are due under each
catch-up policy, and what a bad schedule is told. Pure: no database, no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from sqlmq import Cadence, ConfigurationError, Schedule
from sqlmq.schedules import ON_TIME, ScheduleInfo

T0 = datetime(2026, 11, 24, 12, 0, 0, tzinfo=UTC)


def every(seconds: float, catch_up: str = "latest", max_catch_up: int = 100) -> Schedule:
    return Schedule("s", "q", Cadence(every=seconds), b"x", catch_up,  # type: ignore[arg-type]
                    max_catch_up)


def test_every_ticks_at_multiples_of_the_interval_since_the_epoch() -> None:
    c = Cadence(every=300)
    assert c.latest(T0 + timedelta(minutes=7, seconds=3)) == T0 + timedelta(minutes=5)
    assert c.latest(T0) == T0  # a tick at the moment itself counts
    assert c.after(T0) == T0 + timedelta(minutes=5)
    assert c.after(T0 - timedelta(microseconds=1)) == T0
    assert list(zip(range(3), c.back_from(T0 + timedelta(minutes=11)), strict=False)) == [
        (0, T0 + timedelta(minutes=10)), (1, T0 + timedelta(minutes=5)), (2, T0)]


def test_sub_second_intervals_are_exact() -> None:
    c = Cadence(every=0.3)
    ticks = [c.after(T0)]
    for _ in range(9):
        ticks.append(c.after(ticks[-1]))
    assert [t - ticks[0] for t in ticks] == [timedelta(milliseconds=300 * i) for i in range(10)]
    assert c.micros == 300_000 and c.describe() == "every 0:00:00.300000"


def test_cron_ticks_in_its_time_zone_across_daylight_saving() -> None:
    paris = ZoneInfo("Europe/Paris")
    c = Cadence(cron="0 3 * * *", tz="Europe/Paris")
    before = datetime(2026, 3, 28, 12, 0, tzinfo=paris)  # DST starts on the 29th at 02:00
    first = c.after(before)
    second = c.after(first)
    assert first.tzinfo is UTC and first == datetime(2026, 3, 29, 3, 0, tzinfo=paris)
    assert second - first == timedelta(hours=24)
    assert first.hour == 1 and second.hour == 1  # 03:00 CEST is 01:00 UTC
    assert c.after(datetime(2026, 1, 10, 12, tzinfo=UTC)).hour == 2  # 03:00 CET
    assert c.latest(first) == first and c.latest(first - timedelta(seconds=1)) < first
    assert c.describe() == "cron '0 3 * * *' (Europe/Paris)"


def test_cron_with_seconds() -> None:
    c = Cadence(cron="*/10 * * * * *")
    assert c.after(T0 + timedelta(seconds=1)) == T0 + timedelta(seconds=10)
    back = c.back_from(T0 + timedelta(seconds=25))
    assert [next(back), next(back)] == [T0 + timedelta(seconds=20), T0 + timedelta(seconds=10)]


def test_catch_up_latest_publishes_the_most_recent_missed_tick_only() -> None:
    s = every(60)
    assert s.due(T0, T0 + timedelta(minutes=5, seconds=30)) == [T0 + timedelta(minutes=5)]
    assert s.due(T0 + timedelta(minutes=5), T0 + timedelta(minutes=5, seconds=59)) == []


def test_catch_up_all_publishes_every_missed_tick_up_to_its_bound() -> None:
    s = every(60, "all")
    assert s.due(T0, T0 + timedelta(minutes=3, seconds=1)) == [
        T0 + timedelta(minutes=m) for m in (1, 2, 3)]
    bounded = every(60, "all", max_catch_up=2)
    assert bounded.due(T0, T0 + timedelta(minutes=10)) == [
        T0 + timedelta(minutes=9), T0 + timedelta(minutes=10)]  # the latest ones


def test_catch_up_none_publishes_only_a_tick_that_is_on_time() -> None:
    s = every(3600, "none")
    on_time = T0 + timedelta(hours=1) + ON_TIME
    assert s.due(T0, on_time) == [T0 + timedelta(hours=1)]
    assert s.due(T0, on_time + timedelta(seconds=1)) == []
    assert s.due(T0 - timedelta(hours=5), T0 + timedelta(seconds=1)) == [T0]  # missed: skipped


def test_a_changed_cadence_starts_after_its_registration() -> None:
    info = ScheduleInfo("s", "q", Cadence(every=60), "latest", T0 + timedelta(seconds=30),
                        T0 - timedelta(minutes=1), 7)
    assert info.since == T0 + timedelta(seconds=30)
    assert every(60).due(info.since, T0 + timedelta(seconds=59)) == []
    assert info.next_tick(T0 + timedelta(seconds=40)) == T0 + timedelta(minutes=1)


async def test_body_functions_take_nothing_or_the_tick_and_may_be_async() -> None:
    async def later(tick: datetime) -> str:
        return tick.isoformat()

    for body, expected in [(lambda: 1, 1), (lambda tick: tick.minute, 0),
                           (later, T0.isoformat()), (dict, {})]:
        s = Schedule("s", "q", Cadence(every=1), body, computed=True)
        assert await s.body_at(T0) == expected
    assert await Schedule("s", "q", Cadence(every=1), [1]).body_at(T0) == [1]


@pytest.mark.parametrize(("kwargs", "error"), [
    ({}, "exactly one of cron= or every="),
    ({"cron": "0 3 * * *", "every": 5}, "exactly one of cron= or every="),
    ({"cron": "61 * * * *"}, "cron expression '61 \\* \\* \\* \\*'"),
    ({"cron": "every day"}, "cron expression 'every day'"),
    ({"every": 0}, "every must be a timedelta or seconds of at least 0.001"),
    ({"every": float("nan")}, "every must be"),
    ({"every": "5"}, "every must be"),
    ({"every": 5, "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
    ({"every": 5, "tz": ""}, "tz must be an IANA time zone name"),
])
def test_bad_cadences_are_named(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        Cadence(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"name": ""}, "schedule name must not be empty"),
    ({"name": 5}, "schedule name must be a str"),
    ({"queue": "x" * 200}, "queue name is 200 characters long"),
    ({"catch_up": "some"}, "catch_up must be one of latest, all, none; got 'some'"),
    ({"max_catch_up": 0}, "max_catch_up must be a positive int"),
    ({"priority": 40_000}, "priority must be an int in -32768..32767"),
])
def test_bad_schedules_are_named(kwargs: dict[str, object], error: str) -> None:
    fields: dict[str, object] = {"name": "s", "queue": "q", "cadence": Cadence(every=1),
                                 "body": 1}
    with pytest.raises(ConfigurationError, match=error):
        Schedule(**(fields | kwargs))  # type: ignore[arg-type]
