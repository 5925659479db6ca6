"""The running handlers' lease deadlines: a handler is cancelled at its delivery's
``renewed_until`` (which every extension pushes on), before the lease can end in the
database and another process start the message again.

``asyncio.timeout_at`` around each handler did this with a loop timer per handler, created
and cancelled when the handler returned (the cancelled ones stay in the loop's heap until
it sweeps them): 4.4 µs a handler. A batch's deliveries share their deadline (the time its
acquire was sent, plus the lease), and an extension moves a thousand at once to one new
deadline, so here a timer serves every handler with the same deadline: a handler starting
or ending costs two dictionary entries (1.25 µs in all), and a batch one timer. A drain's
CPU went down by about 0.5-1 µs a message (100,000 on PostgreSQL, six alternating pairs).

The cancellation is asyncio.timeout's: the handler's task is cancelled, and the cancel is
taken back (``Task.uncancel``) when the handler ends, so that only a cancellation of ours
alone becomes :class:`LeaseRanOut`, and one from elsewhere (stop()) stays one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..message import Message
    from ..records import Delivery

Key = tuple[int, int]  # (id, deliveries): one delivery, its fencing token


class LeaseRanOut(Exception):
    """A handler was cancelled because its lease could not be renewed in time."""


class Running:
    """One handler bound by its lease."""

    __slots__ = ("cancelling", "deadline", "expired", "key", "task")

    def __init__(self, key: Key, task: asyncio.Task[Any], deadline: float) -> None:
        self.key = key
        self.task = task
        self.deadline = deadline
        self.cancelling = task.cancelling()  # cancellations asked before ours, if any
        self.expired = False


class LeaseDeadlines:
    """The handlers running within their lease, by deadline, with a loop timer per distinct
    deadline. Plain state on the event loop."""

    __slots__ = ("_at", "_running", "_timers")

    def __init__(self) -> None:
        self._running: dict[Key, Running] = {}
        self._at: dict[float, dict[Key, Running]] = {}
        self._timers: dict[float, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._running)

    def enter(self, key: Key, task: asyncio.Task[Any], deadline: float) -> Running:
        running = self._running[key] = Running(key, task, deadline)
        self._add(running)
        return running

    def leave(self, running: Running) -> bool:
        """``running``'s handler ended; whether its lease had run out (it was cancelled)."""
        if self._running.get(running.key) is running:
            del self._running[running.key]
            if not running.expired:
                self._remove(running)
        return running.expired

    def reschedule(self, key: Key, when: float) -> None:
        """Move the deadline of ``key``'s handler, if one runs and has not been cancelled."""
        running = self._running.get(key)
        if running is None or running.expired or running.deadline == when:
            return
        self._remove(running)
        running.deadline = when
        self._add(running)

    def _add(self, running: Running) -> None:
        at = self._at.get(running.deadline)
        if at is None:
            at = self._at[running.deadline] = {}
            loop = running.task.get_loop()
            self._timers[running.deadline] = loop.call_at(
                running.deadline, self._expire, running.deadline)
        at[running.key] = running

    def _remove(self, running: Running) -> None:
        at = self._at.get(running.deadline)
        if at is None:
            return
        at.pop(running.key, None)
        if not at:
            del self._at[running.deadline]
            self._timers.pop(running.deadline).cancel()

    def _expire(self, deadline: float) -> None:
        self._timers.pop(deadline, None)
        for running in self._at.pop(deadline, {}).values():
            running.expired = True
            running.task.cancel()


async def within_lease(call: Callable[[Message], Awaitable[Any]], msg: Message,
                       d: Delivery, deadlines: LeaseDeadlines) -> Any:
    """``call(msg)`` until ``d``'s lease may have ended: at ``d.renewed_until``, which each
    extension pushes on (:meth:`LeaseDeadlines.reschedule`), it is cancelled and
    :class:`LeaseRanOut` raised, so that a handler never runs beside the next delivery of
    its message (or past its channel's concurrency limit)."""
    task = asyncio.current_task()
    assert task is not None and d.renewed_until is not None
    running = deadlines.enter((d.id, d.deliveries), task, d.renewed_until)
    try:
        result = await call(msg)
    except asyncio.CancelledError:
        if deadlines.leave(running) and task.uncancel() <= running.cancelling:
            raise LeaseRanOut from None
        raise
    except BaseException:
        if deadlines.leave(running):
            task.uncancel()
        raise
    if deadlines.leave(running):  # cancelled, but the handler went on to return
        task.uncancel()
    return result


class LeasesRanOut(LeaseRanOut):
    """A batch handler was cancelled because some of its deliveries' leases (``keys``)
    could not be renewed in time."""

    def __init__(self, keys: set[Key]) -> None:
        super().__init__(f"{len(keys)} lease(s) ran out")
        self.keys = keys


async def within_leases(call: Callable[[], Awaitable[Any]], ds: list[Delivery],
                        deadlines: LeaseDeadlines) -> Any:
    """``call()`` (a batch handler's call) until the first of ``ds``' leases may have
    ended: the whole batch runs in one task, so the first deadline cancels it, as
    :func:`within_lease` does for one delivery; :class:`LeasesRanOut` names the leases
    that ran out (the others are still ours, and are given back)."""
    task = asyncio.current_task()
    assert task is not None
    entered = [deadlines.enter((d.id, d.deliveries), task, d.renewed_until)
               for d in ds if d.renewed_until is not None]
    before = entered[0].cancelling if entered else task.cancelling()

    def leave() -> set[Key]:
        expired = {r.key for r in entered if deadlines.leave(r)}
        for _ in expired:
            task.uncancel()
        return expired

    try:
        result = await call()
    except asyncio.CancelledError:
        expired = leave()
        if expired and task.cancelling() <= before:
            raise LeasesRanOut(expired) from None
        raise
    except BaseException:
        leave()
        raise
    leave()  # cancelled, perhaps, but the handler went on to return
    return result
