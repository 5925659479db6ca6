"""Waiting for a message's ending without an event loop (``Broker.result_sync``).

Code without an event loop has neither a LISTEN connection nor this process's settles to
wake it, so it reads on a synchronous connection at intervals that grow with the wait (a
quarter of it, 5 ms to 1 s; see :func:`.watch.poll_interval`): an answer is late by at most
a quarter of the time it took, and a long wait reads about once a second.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ..errors import ConfigurationError
from .watch import poll_interval

if TYPE_CHECKING:
    from ..engines.contract import Engine
    from ..records import Answer


def refuse_on_a_loop(call: str, instead: str) -> None:
    """A blocking wait on a thread that runs an event loop would hold that loop, and the
    handlers and reads on it, for as long as it waits: refused, naming the async call."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise ConfigurationError(f"{call} blocks its thread, and this thread runs an event loop "
                             f"(its handlers could not answer meanwhile): await {instead} "
                             "instead")


def wait_sync(engine: Engine, msg_id: int, timeout: float | None) -> Answer | None:
    """Message ``msg_id``'s answer once it ended or is nowhere (None), or as it stands when
    ``timeout`` seconds have passed (None: no limit; 0: read once)."""
    start = time.monotonic()
    while True:
        found = engine.answers_sync([msg_id]).get(msg_id)
        if found is None or found.ended:
            return found
        waited = time.monotonic() - start
        if timeout is not None and waited >= timeout:
            return found
        pause = poll_interval(waited)
        if timeout is not None:
            pause = min(pause, timeout - waited)
        time.sleep(pause)


__all__ = ["refuse_on_a_loop", "wait_sync"]
