"""The broker's periodic schedules (see :mod:`sqlmq.schedules`): ``periodic`` registers
one, the broker's start runs them, ``schedules``, ``pause_schedule``, ``resume_schedule``
and ``delete_schedule`` look after them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from .engines.contract import Engine
from .errors import ConfigurationError, UnknownSchedule
from .maintenance import Ticker
from .publishing import prepare
from .schedules import MAX_CATCH_UP, Cadence, CatchUp, Schedule, ScheduleInfo
from .wakeups import Wakeups

F = TypeVar("F", bound=Callable[..., Any])

#: ``body`` left out: the decorated function makes it.
_FROM_FUNCTION: Any = object()


class Scheduling:
    """Periodic schedules, for :class:`sqlmq.Broker` (which sets these attributes)."""

    max_payload_bytes: int
    _engine: Engine
    _wakeups: Wakeups
    _started: bool
    _schedules: list[Schedule]
    _ticker: Ticker | None

    def periodic(
        self, name: str, *, cron: str | None = None, every: timedelta | float | None = None,
        tz: str = "UTC", queue: str | None = None, body: Any = _FROM_FUNCTION,
        catch_up: CatchUp = "latest", max_catch_up: int = MAX_CATCH_UP, priority: int = 0,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Publish a message to ``queue`` (the schedule's ``name`` by default) at each tick
        of ``cron`` (in time zone ``tz``) or ``every`` (a timedelta or seconds), exactly
        once per tick across every process that runs the broker. A decorator: the decorated
        function (sync or async, taking nothing or the tick, an aware UTC datetime) makes
        each tick's body. With ``body=`` the schedule is registered at once with that
        constant body (returned: a :class:`~sqlmq.schedules.Schedule`). ``catch_up``:
        what a start after missed ticks publishes: ``"latest"`` (one message, for the most
        recent), ``"all"`` (one per missed tick, the latest ``max_catch_up``) or ``"none"``.
        The message carries the headers ``schedule`` and ``tick``."""
        if isinstance(every, timedelta):
            every = every.total_seconds()
        cadence = Cadence(cron=cron, every=every, tz=tz)

        def register(made_by: Any, computed: bool) -> Schedule:
            schedule = Schedule(name, name if queue is None else queue, cadence, made_by,
                                catch_up, max_catch_up, priority,
                                {} if headers is None else headers, computed)
            prepare(schedule.queue, [] if computed else [made_by], headers=headers,
                    delay=None, at=None, max_payload_bytes=self.max_payload_bytes)
            if any(s.name == name for s in self._schedules):
                raise ConfigurationError(f"schedule {name!r} is registered twice")
            self._schedules.append(schedule)
            if self._started:
                self._run_schedules()
            return schedule

        if body is not _FROM_FUNCTION:
            return register(body, computed=False)

        def decorator(function: F) -> F:
            if not callable(function):
                raise ConfigurationError(f"@periodic({name!r}) decorates a function that makes "
                                         f"the body, got {function!r}; or pass body=")
            register(function, computed=True)
            return function

        return decorator

    @property
    def periodic_schedules(self) -> list[Schedule]:
        """The schedules registered on this broker (:meth:`schedules` reads the database)."""
        return list(self._schedules)

    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule the database knows (registered by any process), by name, with its
        last tick; ``info.next_tick(await broker.engine.now())`` is its next."""
        return await self._engine.schedules()

    async def delete_schedule(self, name: str) -> bool:
        """Forget a schedule and its last tick (False if the database had none). A process
        still running it registers it again at its next round: remove it from the code
        first."""
        return await self._engine.delete_schedule(name)

    async def pause_schedule(self, name: str) -> bool:
        """Pause schedule ``name`` for every process that runs it, until
        :meth:`resume_schedule`: no tick is published meanwhile, and a process that starts
        (or registers it again) leaves it paused. False: it was paused already. An unknown
        name is an :class:`~sqlmq.errors.UnknownSchedule` naming the schedules that exist."""
        return await self._set_paused(name, True)

    async def resume_schedule(self, name: str) -> bool:
        """Let schedule ``name`` publish again. The ticks that fell while it was paused are
        missed ticks: its ``catch_up`` decides (``"latest"``: one message for the latest of
        them, ``"all"``: each, at most ``max_catch_up``, ``"none"``: none). False: it was
        not paused."""
        changed = await self._set_paused(name, False)
        if changed and self._ticker is not None:
            self._ticker.changed()  # this process publishes what is due at once
        return changed

    async def _set_paused(self, name: str, paused: bool) -> bool:
        changed = await self._engine.pause_schedule(name, paused)
        if changed is None:
            known = ", ".join(repr(s.name) for s in await self._engine.schedules()) or "none"
            raise UnknownSchedule(f"no schedule named {name!r} (schedules: {known})")
        return changed

    def _ticker_of(self) -> Ticker:
        if self._ticker is None:
            self._ticker = Ticker(self._engine, self._schedules, self.max_payload_bytes,
                                  self._wakeups.wake)
        return self._ticker

    async def _register_schedules(self) -> None:
        """Write the schedules' rows before ``start()`` returns: left to the loop's first
        round, ``broker.schedules()`` just after the start listed none of them yet."""
        if self._schedules:
            await self._ticker_of().register()

    def _run_schedules(self) -> None:
        ticker = self._ticker_of()
        ticker.start()  # a no-op once running
        ticker.changed()

    async def _stop_schedules(self) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            await ticker.stop()


__all__ = ["Scheduling"]
