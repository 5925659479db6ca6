"""Freed channel slots passed straight on by the flusher's settles
(``engine.settle_passing``, :mod:`sqlmq.engines.sql.slots`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..lifecycle import Ending, Settlement, decide
from ..records import Delivery
from .counters import RuntimeCounters
from .leases import Holdings

if TYPE_CHECKING:
    from ..engines.contract import Engine
    from ..subscriber import SubscriberConfig


class SlotPassing:
    """Settles a batch holding results of deliveries that held a channel's slot so that
    each freed slot goes straight to the channel's next message, while ``free()`` workers
    could start more; what starts is handed to ``hand_over`` (False: the subscriber no
    longer takes it, as it stops or a suspect runs alone), or given back unstarted through
    ``give_back``. A settle whose reply is lost may have started messages no one runs:
    they come back when their lease expires, as after a crash."""

    def __init__(self, cfg: SubscriberConfig, holdings: Holdings, counters: RuntimeCounters,
                 hand_over: Callable[[Delivery, float | None], bool],
                 free: Callable[[], int], give_back: Callable[[Settlement], None]) -> None:
        self.cfg = cfg
        self._holdings = holdings
        self._counters = counters
        self._hand_over = hand_over
        self._free = free
        self._give_back = give_back

    async def settle(self, engine: Engine, batch: Sequence[Settlement],
                     ) -> tuple[set[int], list[Delivery]]:
        """Settle ``batch``, passing on the slots it frees if workers are free; the ids
        written and the deliveries started (not handed over yet: :meth:`start`)."""
        most = self._free()
        slots = self._slots(batch, most) if most > 0 else {}
        if not slots:
            return await engine.settle(batch), []
        sent = asyncio.get_running_loop().time()
        cfg = self.cfg
        applied, started = await engine.settle_passing(batch, slots, cfg.queues, cfg.lease,
                                                       most)
        for d in started:  # the lease counts from when the settle was sent
            d.renewed_until = sent + cfg.lease
        return applied, started

    def start(self, started: list[Delivery]) -> None:
        """Run the deliveries a settle started (after its results were applied)."""
        self._counters.passed += len(started)
        for d in started:
            sent = None if d.renewed_until is None else d.renewed_until - self.cfg.lease
            if not self._hand_over(d, sent):
                self._holdings.held[(d.id, d.deliveries)] = d
                self._give_back(decide(d, self.cfg, ending=Ending.UNSTARTED))

    def _slots(self, batch: Sequence[Settlement], most: int) -> dict[int, str]:
        """The first ``most`` results of ``batch`` whose delivery held a slot it may pass
        on (its channel's one limit a concurrency limit when it was acquired, or ordered
        without other limits), with the channel. Others (a rate-limited channel's, an
        ordered one with a limit) are not worth the passing settle's extra reads: the
        engine would pass none of theirs on. Each passes one start on at most, so the
        rest would only cost the engine a look at their channels."""
        held = self._holdings.held
        slots: dict[int, str] = {}
        for s in batch:
            d = held.get((s.id, s.deliveries))
            if d is not None and d.passes_slot and d.channel is not None:
                slots[s.id] = d.channel
                if len(slots) >= most:
                    break
        return slots


__all__ = ["SlotPassing"]
