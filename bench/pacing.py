"""A steady publisher, shared by sqlmq's and PGQueuer's latency runs (no dependencies, so
the peer's own venv can import it too)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

PAYLOAD_SIZE = 64
STAMP = 20  # the payload starts with the wall clock at the publish call, in 20 characters


def stamped() -> bytes:
    return f"{time.time():<{STAMP}.6f}".encode().ljust(PAYLOAD_SIZE, b"x")


def latency_of(payload: bytes) -> float:
    """Seconds since the publish call that sent ``payload`` began (same host, one clock)."""
    return time.time() - float(payload[:STAMP])


async def paced(rate: float, seconds: float, send: Callable[[bytes], Awaitable[object]],
                overlap: int = 32) -> float:
    """Start one publish every 1/rate s for ``seconds``; returns the rate achieved.

    Publishes overlap (up to ``overlap`` at once) when one takes longer than the interval,
    as independent request handlers would; each payload is stamped when its publish starts.
    """
    gate = asyncio.Semaphore(overlap)
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    total = int(rate * seconds)

    async def one() -> None:
        async with gate:
            await send(stamped())

    t0 = loop.time()
    for i in range(total):
        delay = t0 + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    return total / (loop.time() - t0)
