"""Periodic schedules on the SQL engines, in SQLAlchemy Core (see :mod:`sqlmq.schedules` for
the model).

Publishing a tick is one transaction: lock the schedule's row (``FOR UPDATE``; SQLite's
BEGIN IMMEDIATE holds every other writer off anyway), give up if the tick is not later than
``last_tick_at`` or the schedule is paused, make the message (the schedule's body function
runs here, so it runs once per tick, not once per process), publish it, record the tick
under its unique key and move ``last_tick_at``. A process that comes second waits for the
lock, then finds the tick taken. The tick rows older than :data:`KEEP_TICKS` are deleted on
the way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, insert, literal, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ...records import NewMessages
from ...schedules import Cadence, Schedule, ScheduleInfo
from ...schema import Schema
from ...sqltime import db_now_plus
from .publish import Step, publish_flow, run_flow

#: How long the record of a published tick is kept. ``last_tick_at`` alone keeps a tick
#: from being published twice; the rows are the unique key's second guard and an audit.
KEEP_TICKS = timedelta(days=1)

#: Makes the message of a tick, in the transaction that publishes it.
Produce = Callable[[], Awaitable[NewMessages]]


class ScheduleRegistry:
    """The schedule half of the engine contract for :class:`~.engine.SqlEngine`."""

    db: AsyncEngine
    schema: Schema
    _wake_statement: Callable[[NewMessages], Step | None]

    async def register_schedule(self, schedule: Schedule) -> ScheduleInfo:
        for _ in range(2):  # a second time if another process inserted it meanwhile
            try:
                async with self.db.begin() as conn:
                    return await self._register(conn, schedule)
            except IntegrityError:
                continue
        raise AssertionError("unreachable: the schedule row exists after a conflict")

    async def _register(self, conn: AsyncConnection, schedule: Schedule) -> ScheduleInfo:
        s = self.schema.schedule
        found = (await conn.execute(
            select(s).where(s.c.name == schedule.name).with_for_update())).first()
        cadence = schedule.cadence
        values: dict[str, Any] = dict(queue=schedule.queue, cron=cadence.cron, tz=cadence.tz,
                                      every_micros=cadence.micros, catch_up=schedule.catch_up)
        if found is None:
            await conn.execute(insert(s).values(
                name=schedule.name, registered_at=db_now_plus(literal(0.0)), **values))
        elif not _info_of(found).same_cadence(schedule):
            # a new cadence starts afresh: its ticks before now are not this schedule's
            await conn.execute(update(s).where(s.c.name == schedule.name).values(
                registered_at=db_now_plus(literal(0.0)), **values))
        elif (found.queue, found.catch_up) != (schedule.queue, schedule.catch_up):
            await conn.execute(update(s).where(s.c.name == schedule.name).values(**values))
        row = (await conn.execute(select(s).where(s.c.name == schedule.name))).one()
        return _info_of(row)

    async def schedules(self) -> list[ScheduleInfo]:
        s = self.schema.schedule
        async with self.db.connect() as conn:
            return [_info_of(r) for r in await conn.execute(select(s).order_by(s.c.name))]

    async def delete_schedule(self, name: str) -> bool:
        s, t = self.schema.schedule, self.schema.schedule_tick
        async with self.db.begin() as conn:
            await conn.execute(delete(t).where(t.c.schedule == name))
            return bool((await conn.execute(delete(s).where(s.c.name == name))).rowcount)

    async def pause_schedule(self, name: str, paused: bool) -> bool | None:
        s = self.schema.schedule
        async with self.db.begin() as conn:
            found = (await conn.execute(select(s.c.paused_at).where(s.c.name == name)
                                        .with_for_update())).first()
            if found is None:
                return None
            if (found.paused_at is not None) == paused:
                return False
            await conn.execute(update(s).where(s.c.name == name).values(
                paused_at=db_now_plus(literal(0.0)) if paused else None))
            return True

    async def fire_tick(self, name: str, tick: Any, produce: Produce) -> int | None:
        try:
            async with self.db.begin() as conn:
                return await self._fire(conn, name, tick, produce)
        except IntegrityError:  # the row lock keeps this from happening; the key decides
            return None

    async def _fire(self, conn: AsyncConnection, name: str, tick: Any,
                    produce: Produce) -> int | None:
        s, t = self.schema.schedule, self.schema.schedule_tick
        last = (await conn.execute(select(s.c.last_tick_at, s.c.paused_at)
                                   .where(s.c.name == name).with_for_update())).first()
        if last is None or last.paused_at is not None or (
                last.last_tick_at is not None and last.last_tick_at >= tick):
            return None  # deleted, paused, or taken by another process
        messages = await produce()
        (msg_id,) = await run_flow(conn, publish_flow(
            self.schema.message, conn.dialect, messages, self._wake_statement(messages)))
        await conn.execute(insert(t).values(schedule=name, tick_at=tick, message_id=msg_id,
                                            published_at=db_now_plus(literal(0.0))))
        await conn.execute(update(s).where(s.c.name == name).values(
            last_tick_at=tick, last_message_id=msg_id))
        await conn.execute(delete(t).where(t.c.schedule == name,
                                           t.c.tick_at < tick - KEEP_TICKS))
        return msg_id


def _info_of(row: Any) -> ScheduleInfo:
    every = None if row.every_micros is None else row.every_micros / 1_000_000
    return ScheduleInfo(row.name, row.queue, Cadence(cron=row.cron, every=every, tz=row.tz),
                        row.catch_up, row.registered_at, row.last_tick_at, row.last_message_id,
                        row.paused_at)


__all__ = ["KEEP_TICKS", "Produce", "ScheduleRegistry"]
