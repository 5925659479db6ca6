"""A publish handed straight to an idle subscriber of this process: one round trip from
publish to handler, where an insert and then an acquire take two. Only on engines whose
``hands_over`` is true (PostgreSQL's NOTIFY wakes its subscribers at once instead)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from .engines.contract import Engine
from .lifecycle import Outcome
from .records import NewMessage, Settlement
from .runtime import SubscriberRuntime
from .wakeups import Wakeups


def idle_runtime(runtimes: Iterable[SubscriberRuntime], wakeups: Wakeups,
                 message: NewMessage) -> SubscriberRuntime | None:
    """A subscriber of this process, on this loop, with nothing to do that would take
    ``message`` (due now) at once."""
    if message.delay > 0 or wakeups.loop is not asyncio.get_running_loop():
        return None
    for runtime in runtimes:
        if runtime.takes_direct(message.queue):
            return runtime
    return None


async def hand_over(engine: Engine, wakeups: Wakeups, runtime: SubscriberRuntime,
                    message: NewMessage) -> int | None:
    """Publish ``message`` already acquired for ``runtime`` and hand it over. The row is
    what an acquire leaves, leased and fenced as usual, so a crash loses nothing. None: its
    queue is paused, nothing was written (the caller publishes it the ordinary way, and it
    waits for the resume)."""
    sent = asyncio.get_running_loop().time()
    d = await engine.publish_leased(message, runtime.cfg.lease)
    if d is None:
        return None
    if not runtime.hand_over(d, sent):  # it began to stop meanwhile: back to the queue
        await engine.settle([Settlement(d.id, d.deliveries, Outcome.RELEASE, refund=True,
                                        attempted=False)])
        wakeups.wake_when_visible(message.queue, None)
    return d.id
