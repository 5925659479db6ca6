"""Background tasks: restarted when they fail unexpectedly, stopped reliably."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from .lifecycle import error_text

log = logging.getLogger("sqlmq")

#: Seconds before a background loop that failed unexpectedly starts again.
LOOP_RESTART_DELAY = 1.0

Loop = Callable[[], Coroutine[Any, Any, None]]


def loop_task(loop: Loop, name: str, stopping: Callable[[], bool]) -> asyncio.Task[None]:
    """Run ``loop`` as a task that restarts it (see :func:`restarting`)."""
    return asyncio.create_task(restarting(loop, name, stopping), name=name)


async def restarting(loop: Loop, name: str, stopping: Callable[[], bool]) -> None:
    """Run a background loop; an error it did not expect is logged with its traceback
    and the loop starts again a second later, instead of the task ending unseen. Once
    ``stopping()`` the error ends the task instead."""
    while True:
        try:
            return await loop()
        except Exception as exc:
            if stopping():
                raise
            log.error("%s failed: %s; restarting it in %.0f s", name, error_text(exc),
                      LOOP_RESTART_DELAY, exc_info=exc)
        await asyncio.sleep(LOOP_RESTART_DELAY)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it has really ended.

    Cancels until it is done: before Python 3.12, ``asyncio.wait_for`` swallows a
    cancellation that arrives as its inner wait completes, so a loop can carry on after one
    ``cancel()`` (and wait forever on a lock its stopper holds). A real exception the task
    ended with is re-raised.
    """
    if task is None or task.done():
        return
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.1)
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
