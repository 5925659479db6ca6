"""How the flusher finds the one result a database refuses, in a batch it keeps refusing:
settle the halves, follow the half that fails, and give up the lone result at fault (its
message is delivered again once its lease expires), so that one bad result never holds the
others, nor an ordered or limited channel behind it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..backoff import describe, unexpected
from ..lifecycle import Settlement

if TYPE_CHECKING:
    from ..engines.contract import Engine
    from ..records import Delivery
    from .counters import RuntimeCounters
    from .leases import Holdings, Key

log = logging.getLogger("sqlmq")


class RefusalSplitting:
    """The flusher's search for a refused result (:class:`~.flusher.Flusher` is one)."""

    engine: Engine
    results: list[Settlement]
    holdings: Holdings
    counters: RuntimeCounters
    _in_doubt: set[Key]
    _flushed: asyncio.Event
    _room: Callable[[], None]

    async def _settle(self, batch: list[Settlement],
                      passing: bool = False) -> tuple[set[int], list[Delivery]]:
        raise NotImplementedError

    def _applied(self, batch: list[Settlement], applied: set[int], passed: int = 0) -> None:
        raise NotImplementedError

    async def _settle_apart(self, batch: list[Settlement], exc: BaseException) -> bool:
        """Find the one result the database refuses: settle the halves and follow the half
        that fails. When both halves fail, the database is refusing everything (a missing
        table, a permission) rather than one result: nothing is given up then, and the flush
        backs off as usual. True when some results were written (or one given up).

        A lone result whose write raised no database error (``exc``: a fault of sqlmq's own,
        as a statement it cannot build) is given up too: no retry mends it, and kept, its
        message would stay PROCESSING under a renewed lease, and an ordered or limited
        channel behind it would wait until the worker stops."""
        progress = False
        while len(batch) > 1:
            mid = len(batch) // 2
            failed = []
            for half in (batch[:mid], batch[mid:]):
                try:
                    applied, _ = await self._settle(half)
                except Exception:
                    failed.append(half)
                else:
                    self._applied(half, applied)
                    progress = True
            if len(failed) != 1:
                return progress
            batch = failed[0]
        if not progress:  # a lone result: nothing shows it is the one at fault
            if len(batch) == 1 and unexpected(exc):
                self._give_up(batch[0], exc)
                return True
            return False
        try:  # it failed beside one that did not; a lock timeout deserves a second try
            applied, _ = await self._settle(batch)
        except Exception as exc:
            if await database_answers(self.engine):
                self._give_up(batch[0], exc)
        else:
            self._applied(batch, applied)
        return True

    def _give_up(self, s: Settlement, exc: BaseException) -> None:
        """Drop a result the database will not take. The message itself stays in the queue,
        PROCESSING under a lease we stop renewing, so it is delivered again once the lease
        expires: nothing is lost, and the worker goes on with everything else."""
        self.results[:] = [r for r in self.results if r is not s]
        self.holdings.held.pop((s.id, s.deliveries), None)
        self._in_doubt.discard((s.id, s.deliveries))
        self.counters.unwritable += 1
        log.error("the result of message %d (delivery %d, %s) cannot be written: %s; it will be "
                  "delivered again when its lease expires", s.id, s.deliveries,
                  s.outcome.name.lower(), describe(exc),
                  exc_info=exc if unexpected(exc) else None)
        self._flushed.set()
        self._room()


async def database_answers(engine: Engine) -> bool:
    """Whether the database answers at all (a batch failing while it does holds a result it
    refuses)."""
    try:
        await engine.now()
    except Exception:
        return False
    return True


__all__ = ["RefusalSplitting", "database_answers"]
