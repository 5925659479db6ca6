"""The subscriber runtime: small services that move messages between the database and a
subscriber's handler, composed by :class:`SubscriberRuntime`.

* :class:`~.fetcher.Fetcher` acquires batches, sized by :class:`~.fetcher.FetchSize`, into
  a bounded prefetch buffer (:class:`~.buffer.WorkBuffer`), polling adaptively and woken
  at once by in-process publishes (and NOTIFY on PostgreSQL), and takes deliveries a
  publish hands over;
* :class:`~.workers.Workers` run the handler and turn what happened into a settlement
  (:func:`sqlmq.lifecycle.decide`);
* :class:`~.flusher.Flusher` writes settlements in batches, one engine call per batch,
  retried until it lands;
* :class:`~.leases.LeaseKeeper` extends the lease of every delivery still held;
* :class:`~.quarantine.Quarantine` runs a suspect (perhaps a poison message) alone.

Nothing here holds a transaction while a handler runs. Memory is bounded by ``prefetch``
plus ``max_unflushed``: when flushing keeps failing, workers wait and fetching stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..dead_letters import LOG_ONLY, DeadLetters
from ..lifecycle import TRACEBACK_LIMIT, Ending, decide
from ..middleware import NO_HOOKS, Hooks
from ..records import Delivery
from ..subscriber import Subscriber
from .batches import BatchFlusher, BatchWorkers
from .counters import RuntimeCounters
from .fetcher import Fetcher
from .flusher import Flusher
from .leases import Holdings, LeaseKeeper
from .quarantine import QUARANTINE_AFTER, Quarantine
from .slot_passing import SlotPassing
from .workers import Workers

if TYPE_CHECKING:
    from ..engines.contract import Engine

__all__ = ["QUARANTINE_AFTER", "TRACEBACK_LIMIT", "RuntimeCounters", "SubscriberRuntime"]

log = logging.getLogger("sqlmq")


def _nobody(ids: list[int]) -> None:
    """No caller of this process waits for results."""


class SubscriberRuntime:
    """One subscriber at work: its services, wired together, started and stopped in order."""

    def __init__(self, engine: Engine, subscriber: Subscriber, wakeup: asyncio.Event,
                 hooks: Hooks = NO_HOOKS, dead_letters: DeadLetters = LOG_ONLY,
                 answered: Callable[[list[int]], None] = _nobody) -> None:
        self.engine = engine
        self.subscriber = subscriber
        self.cfg = cfg = subscriber.config
        self.adapter = subscriber.adapter
        self.counters = RuntimeCounters()
        self.holdings = Holdings()
        # The two signals between services: the gate a quarantine closes (the fetcher waits
        # on it, workers hand deliveries back while it is closed) and room, set whenever the
        # fetcher may go on (a worker took from the buffer, results were written).
        gate, room = asyncio.Event(), asyncio.Event()
        gate.set()
        flusher = Flusher if cfg.batch is None else BatchFlusher
        self.flusher = flusher(engine, cfg, self.counters, self.holdings, room.set,
                               ready=wakeup.set, hooks=hooks, dead_letters=dead_letters,
                               answered=answered)
        self.fetcher = Fetcher(engine, cfg, self.counters, self.holdings, self.flusher.results,
                               gate, room, wakeup, hooks=hooks)
        self.leases = LeaseKeeper(engine, cfg, self.counters, self.holdings,
                                  self.flusher.results, hooks=hooks)
        self.quarantine = Quarantine(cfg, self.fetcher.buffer, self.flusher, gate, room.set,
                                     self.fetcher.parked, self.fetcher.sizing.after_suspect)
        pool = Workers if cfg.batch is None else BatchWorkers
        self.workers = pool(cfg, self.adapter, self.name, self.fetcher.buffer, room.set,
                            self.holdings, self.leases, self.flusher, self.quarantine,
                            hooks=hooks)
        self.flusher.passing = SlotPassing(
            cfg, self.holdings, self.counters, self.fetcher.hand_over, self._free_to_start,
            lambda s: self.flusher.add(s, soon=True))

    def _free_to_start(self) -> int:
        """How many more deliveries this subscriber could start at once: workers neither
        running a handler nor spoken for by the buffer; none while it stops or a suspect
        runs alone, or while the fetcher's last acquire came back full. A settle passes
        freed channel slots on only up to this, so a slot goes straight to the next message
        only while a worker waits for it anyway, and the fetcher's least-recently-served
        order decides whenever the workers are the limit. While acquires come back full,
        the fetcher's batches keep the workers busy, and turns passed a few at a time only
        split its flow into small settles: 1,000 ordered channels of 20, a no-op handler,
        4 workers, PostgreSQL 22,000 -> 11,600 msg/s, the settles' median batch 190 -> 4
        results."""
        if (self.fetcher.stopping or not self.quarantine.gate.is_set()
                or not self.fetcher.caught_up):
            return 0
        return self.cfg.workers - self.workers.running - self.fetcher.buffer.qsize()

    @property
    def name(self) -> str:
        return f"{self.adapter.name}@{','.join(self.cfg.queues)}"

    @property
    def running(self) -> int:
        """Handlers in flight."""
        return self.workers.running

    @property
    def buffered(self) -> int:
        """Fetched messages not started yet (a stop gives them back)."""
        return self.fetcher.buffer.qsize()

    def start(self) -> None:
        self.fetcher.start(self.name)
        self.workers.start()
        self.flusher.start(self.name)
        self.leases.start(self.name)

    def takes_direct(self, queue: str) -> bool:
        """Whether a message published to ``queue`` in this process may come straight here,
        written already acquired, instead of waiting for the next acquire: only while no
        ready backlog was seen and a worker is free for it after those already buffered,
        so the message overtakes nothing and waits for nothing.

        Free after the buffered ones, not "nothing buffered": a burst of publishes hands
        several deliveries over in one loop turn, and the workers take them a turn or two
        later; meanwhile "nothing buffered" sent the next publishes the long way (insert,
        then acquire), whose acquires found full batches, which kept the subscriber from
        looking idle: one MariaDB process at 2,000 msg/s then stayed on the long way for
        a third of its messages, p50 1 ms became 20 ms."""
        return (self.fetcher.idle_for(queue) and not self.flusher.full
                and self.fetcher.buffer.qsize() + self.workers.running < self.cfg.workers)

    def hand_over(self, d: Delivery, sent: float | None = None) -> bool:
        """Run a delivery acquired on this subscriber's behalf (by a statement sent at loop
        time ``sent``). False once stopping: the caller then gives it back."""
        return self.fetcher.hand_over(d, sent)

    def cancel_requested(self, msg_id: int) -> None:
        """``Broker.cancel`` flagged ``msg_id``: its handler here, if any, sees it now."""
        self.holdings.flag_cancel({msg_id})

    async def stop(self, graceful_timeout: float | None = None) -> None:
        """Stop fetching, give unstarted messages back, let running handlers finish within
        ``graceful_timeout``, then flush everything."""
        timeout = self.cfg.graceful_timeout if graceful_timeout is None else graceful_timeout
        for service in (self.fetcher, self.workers, self.flusher, self.leases):
            service.stopping = True
        self.quarantine.gate.set()
        for d in await self.fetcher.stop(max(timeout, 5)):
            self.flusher.add(decide(d, self.cfg, ending=Ending.UNSTARTED))
        await self.workers.stop(timeout)
        # Whatever is still held without a result was cut short: give it back now rather
        # than leaving it to lease expiry.
        settled = {(s.id, s.deliveries) for s in self.flusher.results}
        for key, d in self.holdings.held.items():
            if key not in settled:
                self.flusher.add(decide(d, self.cfg, ending=Ending.CUT_SHORT))
        await self.flusher.stop(max(timeout, 5.0))
        if self.flusher.results:
            log.error("%s stopped with %d unflushed results; their leases will expire and the "
                      "messages will be delivered again", self.name, len(self.flusher.results))
        await self.leases.stop()
