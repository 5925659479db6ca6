"""Waking this process's idle subscribers: one event per subscriber, set by a publish to one
of its queues (at once, or when the caller's transaction commits), by the database's push
notifications (PostgreSQL's LISTEN), or by a recovery of expired leases."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from .commit_hooks import on_commit
from .engines import DriverConnection


class Wakeups:
    """The wake-up events of one broker's subscribers, by queue."""

    def __init__(self) -> None:
        self._events: dict[str, list[asyncio.Event]] = {}
        #: The subscribers' event loop (None until one registers).
        self.loop: asyncio.AbstractEventLoop | None = None

    def register(self, queues: Iterable[str]) -> asyncio.Event:
        """A new event, set whenever one of ``queues`` may have work; call on the loop the
        subscriber runs on."""
        self.loop = asyncio.get_running_loop()
        event = asyncio.Event()
        for queue in queues:
            self._events.setdefault(queue, []).append(event)
        return event

    def clear(self) -> None:
        self._events.clear()

    def wake_when_visible(self, queue: str, connection: Any) -> None:
        """Wake the subscribers of ``queue`` now, or, for a publish in the caller's
        transaction (``connection``), when that commits. A driver's own connection tells no
        one of its commit: the database wakes them then where it can, else they are woken
        now, and poll fast after it (see :mod:`sqlmq.engines.sql.drivers.connection`)."""
        if queue not in self._events:
            return
        if connection is None:
            self.wake(queue)
        elif isinstance(connection, DriverConnection):
            if not connection.COMMIT_WAKES:
                self.wake(queue)
        else:
            on_commit(connection, (id(self), queue), lambda: self.wake(queue))

    def wake(self, queue: str) -> None:
        events = self._events.get(queue)
        if events:
            self._set(events)

    def wake_all(self) -> None:
        self._set(list({e for events in self._events.values() for e in events}))

    def _set(self, events: list[asyncio.Event]) -> None:
        # publish_sync() may run on another thread than the subscribers' loop; an Event set
        # there would not wake that loop until its next timer.
        loop = self.loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is None or here is loop:
            for event in events:
                event.set()
        elif not loop.is_closed():
            for event in events:
                loop.call_soon_threadsafe(event.set)
