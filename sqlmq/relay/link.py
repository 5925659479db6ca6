"""One connection to the far broker, shared by every send of a relay, and opened again
after it broke. Attempts to connect are spaced (doubling up to ``MAX_RECONNECT_DELAY``):
while the broker is down, a message's send fails at once with the last connect error
instead of each of hundreds of concurrent sends trying to connect on its own."""

from __future__ import annotations

import asyncio
import random

from .target import Refused, Target

#: Seconds before the first new attempt to connect after one failed, doubled after each
#: further failure up to ``MAX_RECONNECT_DELAY``.
FIRST_RECONNECT_DELAY = 0.2
MAX_RECONNECT_DELAY = 5.0


class Unreachable(ConnectionError):
    """The far broker could not be connected to; raised again, without a new attempt, to
    sends made before the next attempt is due."""


class Link:
    """Opens ``target`` on the first send and again after it broke; one connect at a time."""

    def __init__(self, target: Target, connect_timeout: float = 10.0) -> None:
        self.target = target
        self.connect_timeout = connect_timeout
        self._lock = asyncio.Lock()
        self._next_attempt = 0.0  # event loop time before which no connect is tried
        self._failures = 0
        self._error: Unreachable | None = None

    async def send(self, envelope: object) -> bool:
        """Send through the target, connecting first if needed. Raises :class:`Refused` for a
        message the far broker can never take, anything else for a failed attempt."""
        target = self.target
        if not target.is_open():
            await self._connect()
        return await target.send(envelope)  # type: ignore[arg-type]

    async def _connect(self) -> None:
        async with self._lock:
            if self.target.is_open():  # another send connected while this one waited
                return
            loop = asyncio.get_running_loop()
            if self._error is not None and loop.time() < self._next_attempt:
                raise self._error
            await self.target.close()  # what is left of the broken connection
            try:
                await asyncio.wait_for(self.target.open(), self.connect_timeout)
            except (Refused, asyncio.CancelledError):
                raise
            except Exception as exc:
                self._failures += 1
                delay = min(MAX_RECONNECT_DELAY,
                            FIRST_RECONNECT_DELAY * 2 ** min(self._failures - 1, 16))
                self._next_attempt = loop.time() + delay * random.uniform(0.8, 1.2)
                self._error = Unreachable(f"cannot connect: {_text(exc)}")
                await self.target.close()
                raise self._error from exc
            self._failures = 0
            self._error = None

    async def close(self) -> None:
        """Close the connection; a later send opens it again."""
        async with self._lock:
            await self.target.close()


def _text(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


__all__ = ["Link", "Unreachable"]
