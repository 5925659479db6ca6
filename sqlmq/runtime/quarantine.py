"""Quarantine: a suspect delivery, perhaps a message that kills its process, runs alone.

A message whose last two deliveries ended without a result (their leases expired: the
process died, or hung) is probably a poison message. It runs alone in its process, with
the prefetched messages handed back and no other handler running, so that if it kills the
process again, only its own delivery count goes up; messages that merely shared a process
with it are not pushed towards ``max_deliveries``. One expiry is not enough: after a single
crash every message the process held has one, and running them all alone would stall the
backlog (measured: ~60 msg/s while workers were being killed repeatedly).

Suspects come in runs: the crashes that made one made its neighbours in the queue suspects
too. So a suspect also makes the fetcher's next acquire small (one message, growing back as
batches come back full): what is fetched while a suspect waits to run is handed back, and a
full batch after each suspect was a batch handed back for the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..lifecycle import Ending, Policy, Settlement, decide
from ..records import Delivery
from .buffer import WorkBuffer
from .flusher import Flusher

#: Consecutive lease expiries after which a message runs in quarantine.
QUARANTINE_AFTER = 2


def is_suspect(history: list[dict[str, Any]]) -> bool:
    """The last deliveries all ended without a result: the process died or the lease ran out."""
    tail = history[-QUARANTINE_AFTER:]
    return len(tail) == QUARANTINE_AFTER and all(e.get("ended") == "lease_expired" for e in tail)


class Quarantine:
    """Runs a suspect delivery alone: closes the gate (no fetching, no starting), waits for
    an acquire in flight to land, hands the buffered deliveries back, waits for running
    handlers, flushes, runs the suspect, and flushes its result before opening the gate
    again."""

    def __init__(self, policy: Policy, buffer: WorkBuffer[Delivery | None],
                 flusher: Flusher, gate: asyncio.Event, room: Callable[[], None],
                 fetch_parked: asyncio.Event,
                 fetch_less: Callable[[], None] = lambda: None) -> None:
        self.policy = policy
        self.buffer = buffer
        #: Set while no acquire is out: what one in flight brings back must be handed back
        #: and flushed too, or the suspect's crash charges it an expired lease.
        self._fetch_parked = fetch_parked
        self.flusher = flusher
        self._room = room  # tells the fetcher it may go on
        #: Open (set) unless a suspect runs: the fetcher waits on it, a worker that finds it
        #: closed hands its delivery back.
        self.gate = gate
        #: Makes the fetcher's next acquire small: a suspect's neighbours are likely
        #: suspects too, and whatever is fetched when the next one runs is handed back.
        self._fetch_less = fetch_less
        self._lock = asyncio.Lock()  # one suspect at a time

    async def run_alone(self, d: Delivery, run: Callable[[Delivery], Awaitable[Settlement | None]],
                        idle: asyncio.Event) -> None:
        """Run ``d`` with ``run`` once nothing else runs (``idle`` set by the workers)."""
        async with self._lock:
            self.gate.clear()
            self._fetch_less()
            try:
                await self._fetch_parked.wait()
                self._hand_back_buffered()
                await idle.wait()
                # Hand-backs and finished results must be durable before the suspect runs,
                # or a crash now would charge those messages a delivery after all.
                await self.flusher.flush_all()
                settlement = await run(d)
                if settlement is not None:  # None: its lease ran out, nothing to write
                    self.flusher.add(settlement)
                await self.flusher.flush_all()
            finally:
                self.gate.set()
                self._room()

    def _hand_back_buffered(self) -> None:
        stop_markers = 0
        while not self.buffer.empty():
            other = self.buffer.get_nowait()
            if other is None:
                stop_markers += 1
            else:
                self.flusher.add(decide(other, self.policy, ending=Ending.UNSTARTED))
        for _ in range(stop_markers):
            self.buffer.put_nowait(None)
