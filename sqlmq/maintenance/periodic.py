"""The loop that publishes a broker's periodic schedules (see :mod:`sqlmq.schedules`).

Each round reads the schedules' state and the clock from the database, asks the engine to
publish the ticks that are due (the engine makes processes take turns per tick), then
sleeps until the next tick of any schedule. Every process that registered a schedule runs
it: there is no leader to lose. A paused schedule is passed over (the engine refuses its
ticks too, should a pause land during a round); a round after its resume publishes what
its ``catch_up`` says of the ticks it missed. A body function that fails (or whose value cannot be
published) is logged with its traceback, and its schedule rests with a growing delay before
that tick is tried again; the other schedules go on. A database fault backs the whole loop
off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from ..backoff import Backoff, unexpected
from ..engines.contract import Engine
from ..lifecycle import error_text
from ..new_messages import NewMessages
from ..publishing import prepare
from ..schedules import Schedule, ScheduleInfo
from ..tasks import cancel_and_wait

log = logging.getLogger("sqlmq")

#: The longest sleep between rounds: a schedule registered meanwhile by another process, or
#: a database clock that jumped, is noticed at least this often.
MAX_WAIT = 30.0
#: Slept past a tick, so that the database's clock has reached it when it is read.
OVERSLEEP = 0.002
#: How long a stop waits for a round in progress (a body function, a tick's transaction).
STOP_TIMEOUT = 10.0
#: The first and the longest rest of a schedule whose body function failed (seconds).
FIRST_REST, MAX_REST = 1.0, 60.0


class Ticker:
    """Publishes the ticks of ``schedules`` (read each round: a schedule registered after
    start joins at the next round; :meth:`changed` wakes the loop for it) on ``engine``.
    ``on_published(queue)`` wakes the local subscribers of a queue that got a message."""

    def __init__(self, engine: Engine, schedules: Sequence[Schedule], max_payload_bytes: int,
                 on_published: Callable[[str], None]) -> None:
        self.engine = engine
        self.schedules = schedules
        self.max_payload_bytes = max_payload_bytes
        self.on_published = on_published
        self._registered: set[str] = set()
        self._resting: dict[str, tuple[datetime, float]] = {}  # until when, and for how long
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Rounds completed (the first publishes the catch-up).
        self.rounds = 0
        self._stopping = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sqlmq-periodic")

    async def stop(self) -> None:
        """Let a round in progress finish (up to :data:`STOP_TIMEOUT`), then end the loop.
        Not a bare cancel: a task cancelled inside a statement leaves SQLAlchemy's SQLite
        connection invalidated but open, its write lock held until it is collected."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self._changed.set()
        await asyncio.wait([task], timeout=STOP_TIMEOUT)
        await cancel_and_wait(task)  # at once if it ended; else it is cut short

    def changed(self) -> None:
        """A schedule was added: run a round now."""
        self._changed.set()

    async def _run(self) -> None:
        backoff = Backoff("periodic schedules")
        while not self._stopping:
            self._changed.clear()
            try:
                wait = await self.round()
            except Exception as exc:
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            self.rounds += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait)

    async def register(self) -> None:
        """Write the rows of the schedules not registered yet. The broker's start awaits it,
        so that ``broker.schedules()`` lists them as soon as ``start()`` returns; a round
        registers those added later."""
        for schedule in self.schedules:
            if schedule.name not in self._registered:
                await self.engine.register_schedule(schedule)
                self._registered.add(schedule.name)

    async def round(self) -> float:
        """Publish what is due; returns the seconds until the next tick (capped)."""
        await self.register()
        known = {info.name: info for info in await self.engine.schedules()}
        now = await self.engine.now()
        read_at = asyncio.get_running_loop().time()
        for schedule in self.schedules:
            info = known.get(schedule.name)
            if info is None:  # deleted while this process runs it: made again
                info = await self.engine.register_schedule(schedule)
            if not info.paused:  # the engine refuses its ticks anyway: no body is made
                await self._publish_due(schedule, info, now)
        wake = min((self._next(s, now) for s in self.schedules), default=None)
        if wake is None:
            return MAX_WAIT
        spent = asyncio.get_running_loop().time() - read_at
        return min(MAX_WAIT, max(0.0, (wake - now).total_seconds() - spent) + OVERSLEEP)

    def _next(self, schedule: Schedule, now: datetime) -> datetime:
        return self._rests_until(schedule, now) or schedule.cadence.after(now)

    def _rests_until(self, schedule: Schedule, now: datetime) -> datetime | None:
        """When a schedule whose body failed may try again, while it rests."""
        resting = self._resting.get(schedule.name)
        return resting[0] if resting is not None and resting[0] > now else None

    async def _publish_due(self, schedule: Schedule, info: ScheduleInfo,
                           now: datetime) -> None:
        if self._rests_until(schedule, now) is not None:
            return
        for tick in schedule.due(info.since, now):
            if self._stopping:
                return
            try:
                msg_id = await self.engine.fire_tick(
                    schedule.name, tick, lambda tick=tick: self._message(schedule, tick))
            except Exception as exc:
                if not unexpected(exc):
                    raise  # the database's fault: the loop backs off
                self._rest(schedule, tick, now, exc)
                return
            self._resting.pop(schedule.name, None)
            if msg_id is not None:
                log.debug("schedule %r published message %d for its tick at %s",
                          schedule.name, msg_id, tick.isoformat())
                self.on_published(schedule.queue)

    async def _message(self, schedule: Schedule, tick: datetime) -> NewMessages:
        body = await schedule.body_at(tick)
        return prepare(schedule.queue, [body], headers=schedule.message_headers(tick),
                       delay=None, at=None, max_payload_bytes=self.max_payload_bytes,
                       priority=schedule.priority)

    def _rest(self, schedule: Schedule, tick: datetime, now: datetime,
              exc: Exception) -> None:
        previous = self._resting.get(schedule.name)
        rest = FIRST_REST if previous is None else min(MAX_REST, previous[1] * 2)
        self._resting[schedule.name] = (now + timedelta(seconds=rest), rest)
        log.error("schedule %r could not publish its tick at %s: %s; trying again in %.0f s",
                  schedule.name, tick.isoformat(), error_text(exc), rest, exc_info=exc)


__all__ = ["Ticker"]
