"""The running handlers' lease deadlines (``sqlmq.runtime.lease_deadlines``): one loop timer
per distinct deadline, a handler cancelled at its deadline raises LeaseRanOut, a cancellation
from elsewhere stays one, and an extension moves a deadline. The end-to-end case (a handler
whose lease could not be renewed, on every engine) is in test_leases.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from sqlmq.records import Delivery
from sqlmq.runtime.lease_deadlines import LeaseDeadlines, LeaseRanOut, within_lease


def _delivery(i: int, until: float) -> Delivery:
    now = datetime.now(UTC)
    d = Delivery(id=i, queue="q", headers={}, payload=b"", attempts=0, deliveries=1,
                 created_at=now, first_attempt_at=now, acquired_at=now,
                 lease_expires_at=now, scheduled_at=now)
    d.renewed_until = until
    return d


def _pending_timers(loop: asyncio.AbstractEventLoop) -> int:
    return sum(1 for h in loop._scheduled if not h.cancelled())  # type: ignore[attr-defined]


async def test_handlers_sharing_a_deadline_share_one_timer_which_goes_when_they_end() -> None:
    loop = asyncio.get_running_loop()
    deadlines = LeaseDeadlines()
    release = asyncio.Event()
    until = loop.time() + 60
    timers_before = _pending_timers(loop)

    async def handler(_: Any) -> str:
        await release.wait()
        return "done"

    tasks = [asyncio.create_task(within_lease(handler, None, _delivery(i, until), deadlines))
             for i in range(100)]
    await asyncio.sleep(0)
    assert len(deadlines) == 100
    assert _pending_timers(loop) == timers_before + 1
    release.set()
    assert await asyncio.gather(*tasks) == ["done"] * 100
    assert len(deadlines) == 0 and _pending_timers(loop) == timers_before


async def test_a_handler_past_its_deadline_is_cancelled_and_raises_lease_ran_out() -> None:
    loop = asyncio.get_running_loop()
    deadlines = LeaseDeadlines()
    cut: list[bool] = []

    async def handler(_: Any) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cut.append(True)
            raise

    task = asyncio.create_task(
        within_lease(handler, None, _delivery(1, loop.time() + 0.05), deadlines))
    with pytest.raises(LeaseRanOut):
        await task
    assert cut == [True] and task.cancelling() == 0 and len(deadlines) == 0


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    loop = asyncio.get_running_loop()
    deadlines = LeaseDeadlines()
    started = asyncio.Event()

    async def handler(_: Any) -> None:
        started.set()
        await asyncio.sleep(10)

    task = asyncio.create_task(
        within_lease(handler, None, _delivery(1, loop.time() + 0.05), deadlines))
    await started.wait()
    task.cancel()  # stop(), before the deadline
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(deadlines) == 0
    await asyncio.sleep(0.1)  # the deadline passes: nothing is left to cancel

    deadline = loop.time() + 0.02
    both = asyncio.create_task(within_lease(handler, None, _delivery(2, deadline), deadlines))
    await asyncio.sleep(0)  # the deadline's timer is armed first ...
    loop.call_at(deadline, both.cancel)  # ... stop() in the same turn, before the handler
    with pytest.raises(asyncio.CancelledError):  # saw either: stop() wins
        await both


async def test_a_handler_that_swallows_the_cancel_returns_and_leaves_no_cancel_behind() -> None:
    loop = asyncio.get_running_loop()
    deadlines = LeaseDeadlines()

    async def stubborn(_: Any) -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "kept going"
        return "slept"

    async def run() -> tuple[str, int]:
        result = await within_lease(stubborn, None, _delivery(1, loop.time() + 0.02),
                                    deadlines)
        await asyncio.sleep(0.01)  # the worker goes on, not cancelled
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    assert await run() == ("kept going", 0)


async def test_an_extension_moves_the_deadline_and_a_lost_lease_ends_the_handler_now() -> None:
    loop = asyncio.get_running_loop()
    deadlines = LeaseDeadlines()
    first = loop.time() + 0.1

    async def handler(_: Any) -> str:
        await asyncio.sleep(0.3)
        return "done"

    task = asyncio.create_task(within_lease(handler, None, _delivery(1, first), deadlines))
    await asyncio.sleep(0)
    deadlines.reschedule((1, 1), loop.time() + 60)  # extended: outlives the first deadline
    assert await task == "done"

    task = asyncio.create_task(within_lease(handler, None, _delivery(2, first + 60),
                                            deadlines))
    await asyncio.sleep(0)
    deadlines.reschedule((2, 1), loop.time())  # the keeper found the lease lost
    with pytest.raises(LeaseRanOut):
        await task
    assert len(deadlines) == 0 and _pending_timers(loop) <= 1
