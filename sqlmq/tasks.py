"""Stopping background tasks reliably."""

from __future__ import annotations

import asyncio
from typing import Any


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
