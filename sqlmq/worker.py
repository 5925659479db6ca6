"""Running a broker as a worker process: start, wait for SIGINT/SIGTERM, drain, stop, with
the log lines an operator reads (what runs, on which database, and why it ended)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any, Protocol

log = logging.getLogger("sqlmq")


async def run(broker: Broker, stop: asyncio.Event | None = None) -> None:
    """Start, run until SIGINT/SIGTERM (or ``stop`` is set), then stop gracefully.

    Start, the signal, the drain and the stop are logged at INFO."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, _on_signal, sig, stop)
            installed.append(sig)
    started = loop.time()
    try:
        await broker.start()
        _log_start(broker)
        await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        _log_drain(broker)
        counters = [r.counters for r in broker.runtimes]
        await broker.close()
        log.info("sqlmq worker stopped after %.1f s: %d completed, %d failed, %d retried, "
                 "%d expired, %d given back", loop.time() - started,
                 sum(c.completed for c in counters), sum(c.failed for c in counters),
                 sum(c.retried for c in counters), sum(c.expired for c in counters),
                 sum(c.released for c in counters))


class Broker(Protocol):
    """What running needs of a :class:`sqlmq.Broker`."""

    url: str
    schema: Any

    @property
    def subscribers(self) -> list[Any]: ...

    @property
    def runtimes(self) -> list[Any]: ...

    @property
    def periodic_schedules(self) -> list[Any]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def _on_signal(sig: signal.Signals, stop: asyncio.Event) -> None:
    log.info("received %s: stopping%s", sig.name, " (already stopping)" if stop.is_set() else "")
    stop.set()


def _log_start(broker: Broker) -> None:
    log.info("sqlmq worker started on %s (table prefix %r): %d subscriber(s), %d periodic "
             "schedule(s)", broker.url, broker.schema.prefix, len(broker.subscribers),
             len(broker.periodic_schedules))
    for sub in broker.subscribers:
        c = sub.config
        log.info("subscriber %s on %s: workers=%d fetch_batch=%d prefetch=%s lease=%gs "
                 "max_deliveries=%s retry=%r ack_policy=%s graceful_timeout=%gs",
                 sub.adapter.name, ", ".join(c.queues), c.workers, c.fetch_batch,
                 c.prefetch, c.lease, c.max_deliveries, c.retry, c.ack_policy.name,
                 c.graceful_timeout)
    for s in broker.periodic_schedules:
        log.info("schedule %r: %s to queue %s, catch_up=%s", s.name, s.cadence.describe(),
                 s.queue, s.catch_up)


def _log_drain(broker: Broker) -> None:
    runtimes = broker.runtimes
    if not runtimes:
        return
    running = sum(r.running for r in runtimes)
    buffered = sum(r.buffered for r in runtimes)
    log.info("draining: %d handler(s) running get up to %gs to finish, %d fetched "
             "message(s) not started go back to the queue", running,
             max(r.cfg.graceful_timeout for r in runtimes), buffered)
