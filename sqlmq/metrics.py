"""Prometheus metrics of a broker, as a middleware (:mod:`sqlmq.middleware`).

::

    broker = Broker(url, metrics_port=9100)        # served on 127.0.0.1:9100 while it runs
    # or: metrics = serve_metrics(broker, 9100, "0.0.0.0") before the broker starts

Each broker has its own ``CollectorRegistry`` (``metrics.registry``), so several brokers in
one process (or in one test run) never collide. What is counted, by queue unless said:

========================================  =================================================
``sqlmq_messages_processed_total``        messages archived COMPLETED
``sqlmq_messages_failed_total``           handler runs that raised (a batch: per message)
``sqlmq_messages_retried_total``          results written as a retry
``sqlmq_messages_dead_lettered_total``    messages archived FAILED
``sqlmq_messages_settled_total``          every result written, by ``outcome``
``sqlmq_messages_published_total``        messages this process published (by destination)
``sqlmq_stale_results_total``             results dropped: the lease had expired
``sqlmq_handler_duration_seconds``        handler runs (histogram), by ``result``
``sqlmq_batch_size``                      messages per batch handler call (histogram)
``sqlmq_end_to_end_latency_seconds``      publish to archive (histogram), by ``outcome``
``sqlmq_in_flight``                       handlers running, by ``queues`` (a subscriber's)
``sqlmq_prefetched``                      fetched deliveries not started, by ``queues``
``sqlmq_fetch_batch_size``, ``_fill``     acquires: messages got, and got / asked
``sqlmq_flush_duration_seconds``          settle flushes: latency
``sqlmq_flush_batch_size``, ``_fill``     settle flushes: results, and results / flush_batch
``sqlmq_lease_extensions_total``          leases extended (renewals and ``msg.extend``)
``sqlmq_leases_lost_total``               leases found lost when renewing
``sqlmq_queue_messages``                  messages in the database by queue and ``state``
``sqlmq_queue_oldest_ready_seconds``      how long the oldest ready message has waited

``sqlmq_leader``                          1 while this broker leads the live workers
========================================  =================================================

A batch handler's call (``batch=``) is one handler run: its duration is observed once, by
each queue it handled messages of, not once per message, so the histogram's sum stays the
time handlers ran (a per-message time would be the batch's time counted again for each
message, or a share of it the handler never measured); ``sqlmq_batch_size`` counts the
messages per call, and the time per message is the one sum over the other. A failure is
counted per message (each message of a call that raised), since each is a failure the
retry strategy decides on, as the retried and dead-lettered counters count messages.

The gauges of running and prefetched deliveries are read from the runtime when scraped.
The queue gauges come from ``broker.stats()`` (the counts the insights layer's overview is
made of) when scraped, at most every ``queue_depth_interval`` seconds (a scrape in between
gets the last figures). They describe the whole database, not this process, so by default
(``queue_depth="leader"``) only one process computes and serves them: the leader of the
live workers (see :mod:`sqlmq.maintenance.heartbeat`), whose ``sqlmq_leader`` is 1. Take
the max over instances in queries (``max by (queue, state) (sqlmq_queue_messages)``), not
the sum: around a change of leader, two may serve them for one heartbeat interval.
``queue_depth=True`` serves them from this process whatever it is (a broker that runs no
subscribers, and so never leads); ``False`` never.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from .errors import ConfigurationError
from .lifecycle import Outcome
from .middleware import BrokerLike, CallNext, CallNextBatch, Middleware, PublishBatch, Settled
from .records import QueueStats

if TYPE_CHECKING:
    from .message import Message

__all__ = ["PrometheusMetrics", "serve_metrics"]

log = logging.getLogger("sqlmq")

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0, 120.0, 300.0)
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            300.0, 900.0, 3600.0, 21600.0, 86400.0)
_FLUSH = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
_FILL = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
_ARCHIVED = (Outcome.COMPLETE, Outcome.FAIL, Outcome.EXPIRE, Outcome.CANCEL)
_STATES = ("pending", "processing", "retryable", "completed", "failed", "expired",
           "cancelled")


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # a core dependency; only a trimmed install lacks it
        raise ImportError("sqlmq's metrics need prometheus_client: pip install "
                          "'prometheus-client>=0.20' (a dependency of sqlmq)") from exc
    return prometheus_client


class _Published:
    """The context of one publish: counts its messages once written."""

    __slots__ = ("batch", "counter")

    def __init__(self, counter: Any, batch: PublishBatch) -> None:
        self.counter = counter
        self.batch = batch

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is None:
            self.counter.labels(self.batch.destination).inc(len(self.batch))


class PrometheusMetrics(Middleware):
    """Counts what a broker does into its own Prometheus registry, and serves it over HTTP
    on ``host:port`` from the broker's start to its stop when ``port`` is given (0: a free
    port, read back from :attr:`port`). ``queue_depth``: also serve the queue gauges
    (read from the database, at most every ``queue_depth_interval`` seconds, waiting at
    most ``queue_depth_timeout`` seconds for them): ``"leader"`` while this broker leads
    the live workers, ``True`` always, ``False`` never."""

    def __init__(self, *, port: int | None = None, host: str = "127.0.0.1",
                 registry: Any = None, queue_depth: bool | Literal["leader"] = "leader",
                 queue_depth_interval: float = 5.0, queue_depth_timeout: float = 5.0) -> None:
        pc = _prometheus()
        if port is not None and (not isinstance(port, int) or not 0 <= port <= 65535):
            raise ConfigurationError(f"metrics port must be from 0 to 65535, got {port!r}")
        if queue_depth not in (True, False, "leader"):
            raise ConfigurationError(f"queue_depth must be True, False or 'leader', got "
                                     f"{queue_depth!r}")
        self.wanted_port = port
        self.host = host
        self.queue_depth = queue_depth
        self.queue_depth_interval = queue_depth_interval
        self.queue_depth_timeout = queue_depth_timeout
        self.registry = pc.CollectorRegistry() if registry is None else registry
        #: The port metrics are served on (None while not serving).
        self.port: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._broker: BrokerLike | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._depth_lock = threading.Lock()
        self._depth: tuple[list[QueueStats], datetime] | None = None
        self._depth_read_at: float | None = None
        r = self.registry
        q = ["queue"]
        self.processed = pc.Counter("sqlmq_messages_processed", "Messages archived "
                                    "COMPLETED", q, registry=r)
        self.failed = pc.Counter("sqlmq_messages_failed", "Handler runs that raised", q,
                                 registry=r)
        self.retried = pc.Counter("sqlmq_messages_retried", "Results written as a retry", q,
                                  registry=r)
        self.dead_lettered = pc.Counter("sqlmq_messages_dead_lettered", "Messages archived "
                                        "FAILED (dead letters)", q, registry=r)
        self.settled_total = pc.Counter("sqlmq_messages_settled", "Results written, by "
                                        "outcome", ["queue", "outcome"], registry=r)
        self.published = pc.Counter("sqlmq_messages_published", "Messages published by "
                                    "this process, by queue or topic", q, registry=r)
        self.stale = pc.Counter("sqlmq_stale_results", "Results dropped because the "
                                "delivery's lease had expired", q, registry=r)
        self.handler_duration = pc.Histogram(
            "sqlmq_handler_duration_seconds", "Handler run time", ["queue", "result"],
            buckets=_SECONDS, registry=r)
        self.batch_size = pc.Histogram(
            "sqlmq_batch_size", "Messages per batch handler call", q, buckets=_SIZES,
            registry=r)
        self.latency = pc.Histogram(
            "sqlmq_end_to_end_latency_seconds", "From publish (database time) to archive "
            "(this process's clock)", ["queue", "outcome"], buckets=_LATENCY, registry=r)
        qs = ["queues"]
        self.fetch_size = pc.Histogram("sqlmq_fetch_batch_size", "Messages per acquire", qs,
                                       buckets=_SIZES, registry=r)
        self.fetch_fill = pc.Histogram("sqlmq_fetch_batch_fill", "Messages got / asked per "
                                       "acquire", qs, buckets=_FILL, registry=r)
        self.flush_duration = pc.Histogram("sqlmq_flush_duration_seconds", "Settle flush "
                                           "latency", qs, buckets=_FLUSH, registry=r)
        self.flush_size = pc.Histogram("sqlmq_flush_batch_size", "Results per settle flush",
                                       qs, buckets=_SIZES, registry=r)
        self.flush_fill = pc.Histogram("sqlmq_flush_batch_fill", "Results / flush_batch "
                                       "per settle flush", qs, buckets=_FILL, registry=r)
        self.lease_extensions = pc.Counter("sqlmq_lease_extensions", "Leases extended", qs,
                                           registry=r)
        self.leases_lost = pc.Counter("sqlmq_leases_lost", "Leases found lost when "
                                      "renewing", qs, registry=r)
        r.register(_Collector(self))

    # ---- serving -------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        return self._server is not None

    def serve(self, port: int | None = None, host: str | None = None) -> int:
        """Serve the metrics over HTTP now (in a thread), on ``port`` (default: the one
        given to the constructor) and ``host``; returns the port. Serving already: its port."""
        if self._server is not None:
            assert self.port is not None
            return self.port
        pc = _prometheus()
        port = self.wanted_port if port is None else port
        if port is None:
            raise ConfigurationError("no port to serve metrics on: pass port=")
        host = self.host if host is None else host
        started = pc.start_http_server(port, addr=host, registry=self.registry)
        if started is None:  # prometheus_client < 0.20 gives nothing to stop it with
            raise ConfigurationError("sqlmq's metrics need prometheus-client>=0.20")
        self._server, self._thread = started
        self.port = self._server.server_port
        log.info("serving Prometheus metrics on http://%s:%d/metrics", host, self.port)
        return self.port

    def close(self) -> None:
        """Stop serving (blocks until the server thread ended)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._thread = None
        self.port = None

    async def broker_started(self, broker: BrokerLike) -> None:
        self._broker = broker
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        if self.wanted_port is not None:
            self.serve()

    async def broker_stopped(self, broker: BrokerLike) -> None:
        await asyncio.to_thread(self.close)
        self._loop = None

    # ---- hooks ---------------------------------------------------------------------------

    def publish(self, batch: PublishBatch) -> _Published:
        return _Published(self.published, batch)

    async def handle(self, msg: Message, call_next: CallNext) -> Any:
        started = time.perf_counter()
        try:
            result = await call_next(msg)
        except BaseException:
            self.handler_duration.labels(msg.queue, "error").observe(
                time.perf_counter() - started)
            self.failed.labels(msg.queue).inc()
            raise
        self.handler_duration.labels(msg.queue, "success").observe(
            time.perf_counter() - started)
        return result

    async def handle_batch(self, msgs: list[Message], call_next: CallNextBatch) -> Any:
        by_queue: dict[str, int] = {}
        for m in msgs:
            by_queue[m.queue] = by_queue.get(m.queue, 0) + 1
        started = time.perf_counter()
        try:
            result = await call_next(msgs)
        except BaseException:
            self._ran_batch(by_queue, time.perf_counter() - started, "error")
            raise
        self._ran_batch(by_queue, time.perf_counter() - started, "success")
        return result

    def _ran_batch(self, by_queue: dict[str, int], seconds: float, result: str) -> None:
        for queue, n in by_queue.items():
            self.handler_duration.labels(queue, result).observe(seconds)
            self.batch_size.labels(queue).observe(n)
            if result == "error":
                self.failed.labels(queue).inc(n)

    def settled(self, event: Settled) -> None:
        queue = event.queue or ""
        if event.stale:
            self.stale.labels(queue).inc()
            return
        outcome = event.outcome
        self.settled_total.labels(queue, outcome.value).inc()
        if outcome is Outcome.COMPLETE:
            self.processed.labels(queue).inc()
        elif outcome is Outcome.RETRY:
            self.retried.labels(queue).inc()
        elif outcome is Outcome.FAIL:
            self.dead_lettered.labels(queue).inc()
        created = event.created_at
        if outcome in _ARCHIVED and created is not None:
            self.latency.labels(queue, outcome.value).observe(
                max(0.0, time.time() - created.timestamp()))

    def fetched(self, queues: Sequence[str], got: int, asked: int) -> None:
        label = ",".join(queues)
        self.fetch_size.labels(label).observe(got)
        if asked:
            self.fetch_fill.labels(label).observe(got / asked)

    def flushed(self, queues: Sequence[str], size: int, limit: int, seconds: float) -> None:
        label = ",".join(queues)
        self.flush_duration.labels(label).observe(seconds)
        self.flush_size.labels(label).observe(size)
        if limit:
            self.flush_fill.labels(label).observe(size / limit)

    def leases_extended(self, queues: Sequence[str], extended: int, lost: int) -> None:
        label = ",".join(queues)
        if extended:
            self.lease_extensions.labels(label).inc(extended)
        if lost:
            self.leases_lost.labels(label).inc(lost)

    # ---- read when scraped -----------------------------------------------------------------

    def queue_stats(self) -> tuple[list[QueueStats], datetime] | None:
        """The queues' counts and the database time they were read at: read again on the
        broker's event loop when older than ``queue_depth_interval`` (the last ones when
        that fails or the broker does not run; None: none yet)."""
        with self._depth_lock:
            fresh = (self._depth_read_at is not None
                     and time.monotonic() - self._depth_read_at < self.queue_depth_interval)
            loop, broker = self._loop, self._broker
            if (fresh or loop is None or broker is None or not loop.is_running()
                    or threading.get_ident() == self._loop_thread):
                return self._depth
            future = asyncio.run_coroutine_threadsafe(_read_stats(broker), loop)
            try:
                self._depth = future.result(self.queue_depth_timeout)
            except Exception as exc:
                future.cancel()
                log.warning("metrics: reading the queues' counts failed: %s", exc)
            self._depth_read_at = time.monotonic()
            return self._depth


async def _read_stats(broker: BrokerLike) -> tuple[list[QueueStats], datetime]:
    return await broker.stats(), await broker.engine.now()


class _Collector:
    """The gauges read when scraped: the runtime's running and prefetched deliveries, and
    the queues' counts."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Any]:
        return []  # not checked at registration: collect() reads the runtime

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        m = self.metrics
        running: dict[str, int] = {}
        buffered: dict[str, int] = {}
        broker = m._broker
        for r in [] if broker is None else broker.runtimes:
            label = ",".join(r.cfg.queues)
            running[label] = running.get(label, 0) + r.running
            buffered[label] = buffered.get(label, 0) + r.buffered
        for name, doc, values in (
                ("sqlmq_in_flight", "Handlers running", running),
                ("sqlmq_prefetched", "Fetched deliveries not started yet", buffered)):
            family = GaugeMetricFamily(name, doc, labels=["queues"])
            for label, value in sorted(values.items()):
                family.add_metric([label], value)
            yield family
        leading = broker is not None and broker.leading
        leader = GaugeMetricFamily("sqlmq_leader", "1 while this broker leads the live "
                                   "workers (and serves the queue gauges)")
        leader.add_metric([], 1 if leading else 0)
        yield leader
        if not m.queue_depth or (m.queue_depth == "leader" and not leading):
            return
        read = m.queue_stats()
        if read is None:
            return
        stats, now = read
        depth = GaugeMetricFamily("sqlmq_queue_messages", "Messages in the database by "
                                  "queue and state", labels=["queue", "state"])
        oldest = GaugeMetricFamily("sqlmq_queue_oldest_ready_seconds", "How long the oldest "
                                   "ready message has waited (0: none)", labels=["queue"])
        for s in stats:
            for state in _STATES:
                depth.add_metric([s.queue, state], getattr(s, state))
            age = 0.0
            if s.oldest_ready_at is not None and (s.pending or s.retryable):
                age = max(0.0, (now - s.oldest_ready_at).total_seconds())
            oldest.add_metric([s.queue], age)
        yield depth
        yield oldest


def serve_metrics(broker: BrokerLike, port: int = 9100, host: str = "127.0.0.1",
                  **options: Any) -> PrometheusMetrics:
    """Serve ``broker``'s Prometheus metrics on ``host:port`` from its start to its stop (the
    command line's ``sqlmq worker --metrics-port``). Call it before the broker starts;
    ``options`` go to :class:`PrometheusMetrics`. A broker that has metrics already
    (``Broker(metrics_port=…)``) keeps them, served on ``port``."""
    existing = broker.metrics
    if existing is not None:
        if existing.serving and existing.port != port and port != 0:
            raise ConfigurationError(f"the broker's metrics are served on port "
                                     f"{existing.port} already")
        existing.wanted_port, existing.host = port, host
        return existing
    metrics = PrometheusMetrics(port=port, host=host, **options)
    broker.add_middleware(metrics, first=True)
    broker.metrics = metrics
    return metrics
