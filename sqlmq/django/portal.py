"""An event loop on a thread of its own, for the broker's async calls from Django's code.

A web process runs Django's views on threads (WSGI), or on an event loop whose tasks come
and go (ASGI, and each async test its own loop), while an async SQLAlchemy engine's pooled
connections belong to the loop they were opened on. So the broker's reads (a task's result,
the migration) all run on this one loop, whichever thread or loop asks; a publish does not
come here: it runs on Django's connection, on the caller's thread (:mod:`.outbox`).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class Portal:
    """One event loop thread per process (a forked worker starts its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="sqlmq-django",
                                          daemon=True)
                thread.start()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
            return self._loop

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the portal's loop and wait for it (blocking this thread)."""
        loop = self._running()
        if threading.current_thread() is self._thread:
            raise RuntimeError("the sqlmq portal's own thread cannot wait for itself")
        return asyncio.run_coroutine_threadsafe(_awaited(make), loop).result()

    async def acall(self, make: Callable[[], Awaitable[T]]) -> T:
        """The same from a coroutine of another loop, without blocking it."""
        loop = self._running()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_awaited(make), loop))


async def _awaited(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


#: The process's portal.
portal = Portal()

__all__ = ["Portal", "portal"]
