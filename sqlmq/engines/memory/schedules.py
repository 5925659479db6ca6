"""Periodic schedules on the in-memory engine: the model of
:mod:`sqlmq.engines.sql.schedules`, in one process. A tick is checked under the engine's
lock, its message made outside it (the body function may await), and published under the
lock again after a second check, so two brokers sharing the engine publish it once."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime
from typing import Any

from ...schedules import Schedule, ScheduleInfo
from ..sql.schedules import Produce


class MemorySchedules:
    """The schedule half of the engine contract for :class:`~.engine.MemoryEngine`."""

    _lock: threading.Lock
    _store: Any
    _writes: int
    _now: Any

    @property
    def _registry(self) -> dict[str, ScheduleInfo]:
        return self._store.schedules  # type: ignore[no-any-return]

    async def register_schedule(self, schedule: Schedule) -> ScheduleInfo:
        with self._lock:
            found = self._registry.get(schedule.name)
            if found is None or not found.same_cadence(schedule):
                found = ScheduleInfo(schedule.name, schedule.queue, schedule.cadence,
                                     schedule.catch_up, self._now(), None, None,
                                     None if found is None else found.paused_at)
            else:
                found = replace(found, queue=schedule.queue, catch_up=schedule.catch_up)
            self._registry[schedule.name] = found
            return found

    async def schedules(self) -> list[ScheduleInfo]:
        with self._lock:
            return sorted(self._registry.values(), key=lambda s: s.name)

    async def delete_schedule(self, name: str) -> bool:
        with self._lock:
            return self._registry.pop(name, None) is not None

    async def pause_schedule(self, name: str, paused: bool) -> bool | None:
        with self._lock:
            found = self._registry.get(name)
            if found is None:
                return None
            if found.paused == paused:
                return False
            self._registry[name] = replace(found, paused_at=self._now() if paused else None)
            return True

    def _takes(self, name: str, tick: datetime) -> bool:
        found = self._registry.get(name)
        return found is not None and not found.paused and (
            found.last_tick_at is None or found.last_tick_at < tick)

    async def fire_tick(self, name: str, tick: Any, produce: Produce) -> int | None:
        with self._lock:
            if not self._takes(name, tick):
                return None
        messages = await produce()
        with self._lock:
            if not self._takes(name, tick):
                return None
            rows, (msg_id,) = self._store.new_rows(messages, self._now())
            self._store.add(rows)
            self._writes += 1
            self._registry[name] = replace(self._registry[name], last_tick_at=tick,
                                           last_message_id=msg_id)
            return msg_id  # type: ignore[no-any-return]


__all__ = ["MemorySchedules"]
