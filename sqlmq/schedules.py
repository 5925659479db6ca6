"""Periodic schedules: a message published to a queue at every tick of a cadence, exactly
once per tick however many processes run the schedule.

A **cadence** is a cron expression in a time zone (``"0 3 * * *"`` in ``Europe/Paris``:
03:00 local time, daylight saving included; a sixth field counts seconds), parsed by
``cronsim``, or a fixed interval (``every=timedelta(minutes=5)``), whose ticks are the
multiples of the interval since the Unix epoch, so every process computes the same ones.

Who publishes a tick is decided by the database, not by a leader that can die: each
process that runs the schedule wakes at the tick, reads the database's clock, and asks the
engine to publish the ticks that are due. The engine locks the schedule's row, checks the
tick is later than the last one published, publishes the message, records the tick under a
unique key and moves ``last_tick_at``, in one transaction (see
:mod:`sqlmq.engines.sql.schedules`). Processes that come second find the tick taken.

Ticks missed while no process ran are handled by the schedule's ``catch_up``:
``"latest"`` publishes one message for the most recent missed tick, ``"all"`` one per
missed tick (the latest ``max_catch_up``), ``"none"`` none (a tick is missed when it is
more than :data:`ON_TIME` old). A schedule whose cadence changed starts afresh: ticks of
the new cadence before the change are not its own.

An operator may **pause** a schedule (``Broker.pause_schedule``, schema version 25): the
engine publishes none of its ticks while it is paused, whichever process asks, and a
restart or a deploy that registers it again leaves it paused. Ticks that fell while it was
paused are missed ticks like those of a stopped process: once it is resumed,
``catch_up`` decides, so ``"latest"`` publishes one message for the latest of them,
``"none"`` nothing, and only ``"all"`` publishes a burst (at most ``max_catch_up``).

This module is the model (what is due, and when to wake); it does no I/O.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import ConfigurationError
from .schema import MAX_CRON, MAX_PRIORITY, MIN_PRIORITY
from .subscriber import check_name, check_queue

CatchUp = Literal["latest", "all", "none"]
CATCH_UP_POLICIES: tuple[str, ...] = ("latest", "all", "none")

#: Under ``catch_up="none"``, how old a tick may be and still be published: a process that
#: wakes a little after its tick (a busy event loop, a slow database) is not catching up.
ON_TIME = timedelta(seconds=10)
#: ``catch_up="all"`` publishes at most this many missed ticks unless told otherwise.
MAX_CATCH_UP = 100
#: The headers a schedule's messages carry: the schedule's name and the tick (ISO 8601, UTC).
SCHEDULE_HEADER = "schedule"
TICK_HEADER = "tick"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def _zone(tz: Any) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise ConfigurationError(f"tz must be an IANA time zone name, got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"unknown time zone {tz!r}: use an IANA name such as 'UTC' or 'Europe/Paris'"
        ) from None


@dataclass(frozen=True)
class Cadence:
    """When a schedule ticks: ``cron`` in time zone ``tz``, or ``every`` seconds."""

    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    _micros: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError("a schedule needs exactly one of cron= or every=")
        zone = _zone(self.tz)
        if self.cron is not None:
            if not isinstance(self.cron, str) or len(self.cron) > MAX_CRON:
                raise ConfigurationError(
                    f"cron must be a cron expression of at most {MAX_CRON} characters, got "
                    f"{self.cron!r}")
            try:
                CronSim(self.cron, datetime.now(zone))
            except CronSimError as exc:
                raise ConfigurationError(f"cron expression {self.cron!r}: {exc}") from None
            return
        every = self.every
        if isinstance(every, timedelta):
            every = every.total_seconds()
        if isinstance(every, bool) or not isinstance(every, int | float) \
                or not math.isfinite(every) or every < 0.001:
            raise ConfigurationError(
                f"every must be a timedelta or seconds of at least 0.001, got {self.every!r}")
        object.__setattr__(self, "every", float(every))
        object.__setattr__(self, "_micros", round(every * 1_000_000))

    @property
    def micros(self) -> int | None:
        """The interval in microseconds (None for a cron cadence)."""
        return None if self.cron is not None else self._micros

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron!r}" + ("" if self.tz == "UTC" else f" ({self.tz})")
        return f"every {timedelta(microseconds=self._micros)}"

    def latest(self, moment: datetime) -> datetime:
        """The last tick at or before ``moment`` (UTC)."""
        if self.cron is None:
            return _EPOCH + _MICRO * (self._micros * (_since_epoch(moment) // self._micros))
        return next(self._cron(moment + _MICRO, reverse=True)).astimezone(UTC)

    def after(self, moment: datetime) -> datetime:
        """The first tick after ``moment`` (UTC)."""
        if self.cron is None:
            return _EPOCH + _MICRO * (self._micros * (_since_epoch(moment) // self._micros + 1))
        return next(self._cron(moment)).astimezone(UTC)

    def back_from(self, moment: datetime) -> Iterator[datetime]:
        """The ticks at or before ``moment``, latest first (UTC)."""
        if self.cron is not None:
            for tick in self._cron(moment + _MICRO, reverse=True):
                yield tick.astimezone(UTC)
            return
        tick = self.latest(moment)
        while True:
            yield tick
            tick -= _MICRO * self._micros

    def _cron(self, start: datetime, *, reverse: bool = False) -> Iterator[datetime]:
        assert self.cron is not None
        return iter(CronSim(self.cron, start.astimezone(ZoneInfo(self.tz)), reverse=reverse))


def _since_epoch(moment: datetime) -> int:
    """Microseconds from the Unix epoch to ``moment`` (exact: no float on the way)."""
    return (moment - _EPOCH) // _MICRO


@dataclass(frozen=True)
class Schedule:
    """A periodic schedule as the code registers it (``Broker.periodic``): publish the
    value of ``body`` (a constant, or a function called at each tick: with no argument, or
    with the tick, an aware UTC datetime) to ``queue`` at each tick of ``cadence``."""

    name: str
    queue: str
    cadence: Cadence
    body: Any
    catch_up: CatchUp = "latest"
    max_catch_up: int = MAX_CATCH_UP
    priority: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Whether ``body`` is a function to call (else it is the body itself).
    computed: bool = False

    def __post_init__(self) -> None:
        check_name(self.name, "schedule name")
        check_queue(self.queue)
        if self.catch_up not in CATCH_UP_POLICIES:
            raise ConfigurationError(f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}; "
                                     f"got {self.catch_up!r}")
        if isinstance(self.max_catch_up, bool) or not isinstance(self.max_catch_up, int) \
                or self.max_catch_up < 1:
            raise ConfigurationError(f"max_catch_up must be a positive int, got "
                                     f"{self.max_catch_up!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int) \
                or not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise ConfigurationError(f"priority must be an int in {MIN_PRIORITY}.."
                                     f"{MAX_PRIORITY}, got {self.priority!r}")

    def due(self, since: datetime, now: datetime) -> list[datetime]:
        """The ticks to publish, oldest first, when the ticks up to ``since`` are done (the
        last published, or the moment the cadence was registered) and it is ``now``."""
        latest = self.cadence.latest(now)
        if latest <= since:
            return []
        if self.catch_up == "latest":
            return [latest]
        if self.catch_up == "none":
            return [latest] if now - latest <= ON_TIME else []
        ticks = []
        for tick in self.cadence.back_from(now):
            if tick <= since or len(ticks) == self.max_catch_up:
                break
            ticks.append(tick)
        return ticks[::-1]

    async def body_at(self, tick: datetime) -> Any:
        """The body to publish for ``tick``."""
        if not self.computed:
            return self.body
        value = self.body(tick) if _takes_argument(self.body) else self.body()
        return await value if inspect.isawaitable(value) else value

    def message_headers(self, tick: datetime) -> dict[str, str]:
        return {**self.headers, SCHEDULE_HEADER: self.name, TICK_HEADER: tick.isoformat()}


def _takes_argument(function: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: call it bare
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as the database knows it (``Broker.schedules()``, ``sqlmq schedules``)."""

    name: str
    queue: str
    cadence: Cadence
    catch_up: str
    #: Since when this cadence holds (database clock): earlier ticks are not its own.
    registered_at: datetime
    last_tick_at: datetime | None
    last_message_id: int | None
    #: Since when an operator has paused it (database clock; None: it runs). While paused,
    #: no process publishes its ticks; resumed, the ticks it missed meanwhile are missed
    #: ticks like any other, and its ``catch_up`` decides (see :data:`CATCH_UP_POLICIES`).
    paused_at: datetime | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def since(self) -> datetime:
        """The ticks up to this moment are done (published, skipped, or not its own)."""
        if self.last_tick_at is None:
            return self.registered_at
        return max(self.registered_at, self.last_tick_at)

    def next_tick(self, now: datetime) -> datetime:
        """The next tick a running process publishes, seen at ``now``."""
        return self.cadence.after(max(now, self.since))

    def same_cadence(self, schedule: Schedule) -> bool:
        return self.cadence == schedule.cadence


__all__ = ["Cadence", "CatchUp", "Schedule", "ScheduleInfo"]
