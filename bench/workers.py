"""Workers sweep: what a user who writes only ``workers=`` gets (issue 15's first figures).

A drain of N preloaded messages with a subscriber configured by ``workers`` alone (every
other setting at its default), for each worker count, with a no-op handler and with a
handler that sleeps 10 ms (I/O-bound); the bench's tuned drain configuration runs in the
same rounds for the "defaults versus best" comparison.
"""

from __future__ import annotations

from typing import Any

from .common import PAYLOAD, drop_tables, fresh_broker, url_for
from .drain import SQLMQ_DRAIN, preload, timed_drain

#: The other candidate for the best configuration: batches twice the default ceiling.
BIG_BATCHES = {"workers": 8, "fetch_batch": 1000, "prefetch": 3000, "flush_batch": 2000,
               "flush_interval": 0.02}

#: The handler's work per message, in seconds, for each kind.
HANDLERS = {"no-op": 0.0, "sleep 10 ms": 0.010}


async def drain_with(db: str, n: int, options: dict[str, Any], sleep: float) -> float:
    """Messages per second from start() until all ``n`` are archived, the subscriber built
    with exactly ``options``."""
    broker = await fresh_broker(db)
    try:
        await preload(broker, n)
        return await timed_drain(broker, n, options, sleep)
    finally:
        await broker.close()
        drop_tables(url_for(db))


def sweep_cases(workers: list[int]) -> list[tuple[str, dict[str, Any]]]:
    """(label, subscriber options) per case: each worker count alone, then the tuned set."""
    cases: list[tuple[str, dict[str, Any]]] = [("defaults", {})]
    cases += [(f"workers={w}", {"workers": w}) for w in workers]
    for tuned in (SQLMQ_DRAIN, BIG_BATCHES):
        cases.append(("tuned: " + ", ".join(f"{k}={v}" for k, v in tuned.items()),
                      dict(tuned)))
    return cases


def default_workers() -> int:
    """The worker count a subscriber gets when the user names none."""
    import inspect

    from sqlmq import Broker

    return int(inspect.signature(Broker.subscriber).parameters["workers"].default)


def messages_for(handler_sleep: float, workers: int, n: int) -> int:
    """Enough messages for a few seconds of an I/O-bound drain, at most ``n``: a 10 ms
    handler with one worker does 100 a second."""
    if not handler_sleep:
        return n
    return min(n, max(500, int(workers / handler_sleep * 3)))


__all__ = ["HANDLERS", "PAYLOAD", "default_workers", "drain_with", "messages_for",
           "sweep_cases"]
