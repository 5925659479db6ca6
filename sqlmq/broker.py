"""The broker: configuration, publishing (:mod:`sqlmq.publisher`: async and sync, on its
own connections or in the caller's transaction, always through the engine), the registry of
subscribers, and start/stop. Which database it runs on is the engine's business
(:mod:`sqlmq.engines`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import URL
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.ext.asyncio import AsyncEngine

from .admin import Administration
from .connect import safe_url
from .dead_letters import DeadLetters
from .engines import engine_for
from .engines.contract import Engine, WakeSource
from .errors import ConfigurationError
from .lifecycle import AckPolicy, Archive
from .maintenance import LeaseRecovery
from .middleware import Hooks
from .operations import Operations
from .publisher import Publisher
from .results.requester import Results
from .results.watch import ResultWatch
from .retry import Retry, RetryStrategy
from .runtime import SubscriberRuntime
from .scheduling import Scheduling
from .schema import DEFAULT_MAX_PAYLOAD, DEFAULT_PREFIX, Schema, build_schema
from .subscriber import HandlerAdapter, Subscriber, SubscriberConfig
from .topics import subscription
from .wakeups import Wakeups
from .workflows.api import Workflows

if TYPE_CHECKING:
    from .maintenance import Retention
    from .metrics import PrometheusMetrics

#: Seconds ``start()`` waits at most for the wake-up listener (PostgreSQL's LISTEN).
LISTEN_WAIT = 5.0


async def _listening(source: WakeSource | None) -> None:
    """Until ``source`` hears notifications (a publish committed after this returns wakes
    the subscribers at once, not at their next poll), for ``LISTEN_WAIT`` at most: a
    listener that cannot connect logs why and retries, and the polls cover meanwhile."""
    if source is not None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LISTEN_WAIT):
                await source.listening()


class Broker(Publisher, Results, Scheduling, Administration, Operations, Workflows):
    """A message broker on a database you already run.

    ``target`` is a URL (``postgresql://…``, ``mysql://…``/``mariadb://…``,
    ``sqlite:///path``, or ``memory://`` for an in-process broker in tests) or your own
    SQLAlchemy ``AsyncEngine`` (or sync ``Engine``, which then serves ``publish_sync`` only).

    ``middleware``: hooks around publish and handle (see :mod:`sqlmq.middleware`), the first
    outermost. ``metrics_port``: serve Prometheus metrics on ``metrics_host:metrics_port``
    while the broker runs (see :mod:`sqlmq.metrics`; 0 picks a free port).
    ``heartbeat_interval``: seconds between two heartbeats of its row in the live workers
    registry while it runs subscribers (see :mod:`sqlmq.operations`). ``retention``: how
    long the archive keeps completed and failed messages; the leader of the live workers
    deletes the older ones (see :mod:`sqlmq.maintenance.retention`).

    Its calls come in six parts, each a module a reader can take on its own: this class
    (configuration, ``subscriber``, start, stop, ``run``), :class:`~sqlmq.publisher.Publisher`
    (publishing, sync and async, in your transaction or not),
    :class:`~sqlmq.results.requester.Results` (waiting for results, request/reply),
    :class:`~sqlmq.scheduling.Scheduling` (periodic schedules),
    :class:`~sqlmq.admin.Administration` (channels, topic groups, ``cancel``, ``stats``,
    ``insights``) and :class:`~sqlmq.operations.Operations` (pause, requeue, purge, the live
    workers). The API reference and docs/architecture.md list them part by part.
    """

    def __init__(
        self, target: str | URL | AsyncEngine | SyncEngine, *,
        table_prefix: str = DEFAULT_PREFIX, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        recovery_interval: float = 5.0, recovery_spread: float = 1.0,
        middleware: Iterable[object] = (), metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1", heartbeat_interval: float = 5.0,
        retention: Retention | None = None,
    ) -> None:
        self.schema: Schema = build_schema(table_prefix)
        self.max_payload_bytes = max_payload_bytes
        self.recovery_interval = recovery_interval
        self.recovery_spread = recovery_spread
        self._registry_settings(heartbeat_interval, retention)
        self._engine: Engine = engine_for(target, self.schema)  # checks ``target``
        #: The database URL as the user gave it, with the password masked.
        self.url = safe_url(target)
        self._subscribers: list[Subscriber] = []
        self._runtimes: list[SubscriberRuntime] = []
        self._wakeups = Wakeups()
        self._recovery: LeaseRecovery | None = None
        self._schedules = []
        self._ticker = None
        self._started = False
        #: The engine's push wake-ups while running (PostgreSQL's LISTEN connection).
        self.listener: WakeSource | None = None
        self._hooks = Hooks(middleware)
        self._hooks_started = False
        self._dead_letters = DeadLetters()  # the WARNING line and @on_dead_letter hooks
        self._results = ResultWatch(self._engine)  # callers waiting for results
        #: The Prometheus metrics of this broker (``metrics_port`` or
        #: :func:`sqlmq.metrics.serve_metrics`), else None.
        self.metrics: PrometheusMetrics | None = None
        if metrics_port is not None:
            from .metrics import PrometheusMetrics

            self.metrics = PrometheusMetrics(port=metrics_port, host=metrics_host)
            self._hooks.add(self.metrics, first=True)

    def __repr__(self) -> str:
        return f"Broker({self.url!r})"

    @property
    def engine(self) -> Engine:
        """The engine contract for this database (acquire, settle, stats, …)."""
        return self._engine

    @property
    def db(self) -> AsyncEngine:
        """The async SQLAlchemy engine the broker runs on (created on first use)."""
        return _sqlalchemy(self, "db")  # type: ignore[no-any-return]

    @property
    def sync_db(self) -> SyncEngine:
        """The synchronous SQLAlchemy engine ``publish_sync`` runs on (created on first use)."""
        return _sqlalchemy(self, "sync_db")  # type: ignore[no-any-return]

    # ---- schema --------------------------------------------------------------------------

    async def migrate(self) -> int:
        """Create or upgrade the tables; safe to call from many processes at once."""
        return await self._engine.migrate()

    async def check_schema(self) -> None:
        await self._engine.check_schema(self.url)

    # ---- middleware ----------------------------------------------------------------------

    def add_middleware(self, middleware: object, *, first: bool = False) -> None:
        """Register a middleware (see :mod:`sqlmq.middleware`) after those given so far, or
        with ``first`` before them (outermost). Before :meth:`start`: the subscribers' hooks
        are composed when they start."""
        if self._started:
            raise ConfigurationError(
                "add middleware before start(): the subscribers' hooks are composed when "
                "they start")
        self._hooks.add(middleware, first=first)

    @property
    def middleware(self) -> list[object]:
        """The middleware registered, outermost first."""
        return list(self._hooks.middleware)

    # ---- subscribers ---------------------------------------------------------------------

    def subscriber(
        self, queues: str | Sequence[str] | None = None, *,
        topic: str | Sequence[str] | None = None, group: str | None = None,
        workers: int = 8, fetch_batch: int = 1000,
        prefetch: int | None = None, min_fetch_interval: float = 0.0,
        max_fetch_interval: float = 1.0, flush_interval: float = 0.05, flush_batch: int = 2000,
        max_unflushed: int = 10_000, lease: float = 30.0, renew_leases: bool = True,
        recovery_interval: float | None = None, retry: RetryStrategy | None = None,
        max_deliveries: int | Literal["auto"] | None = "auto",
        ack_policy: AckPolicy | str = AckPolicy.NACK_ON_ERROR, graceful_timeout: float = 30.0,
        publish_to: str | None = None, archive: Archive | str = Archive.ALL,
        results: bool = False, batch: int | None = None, batch_wait: float | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a handler for one or more queues (a decorator). With ``topic`` (a
        pattern or several: see :mod:`sqlmq.topics`) and ``group``, it consumes the group's
        copies of the messages published to the matching topics; the group is made when the
        broker starts, so register topic subscribers before :meth:`start`. With
        ``publish_to``, the handler's return value is published to that queue in the
        transaction that archives its message (see :mod:`sqlmq.pipeline`). ``archive``:
        which ended messages are kept in the archive, ``"all"``, ``"failed"`` (all but the
        completed ones) or ``"none"``; the others are deleted in the same fenced statement
        (see :class:`~sqlmq.lifecycle.Archive`). With ``results``, its return value is kept
        for ``result`` and ``request`` (see :mod:`sqlmq.results`; needs ``archive="all"``;
        a batch handler returns a list of one value per message). ``batch``: see
        :mod:`sqlmq.runtime.batches`."""
        consumed, groups = subscription(queues, topic, group)
        if groups and self._started:
            raise ConfigurationError(
                "register topic subscribers before start(): their groups are made when the "
                "broker starts (or await join_group() and subscribe to its queue)")
        config = SubscriberConfig(
            queues=consumed, groups=groups, workers=workers,
            fetch_batch=fetch_batch, prefetch=prefetch, min_fetch_interval=min_fetch_interval,
            max_fetch_interval=max_fetch_interval, flush_interval=flush_interval,
            flush_batch=flush_batch, max_unflushed=max_unflushed, lease=lease,
            renew_leases=renew_leases, max_deliveries=max_deliveries,
            recovery_interval=(self.recovery_interval if recovery_interval is None
                               else recovery_interval),
            retry=retry if retry is not None else Retry.exponential(),
            ack_policy=AckPolicy(ack_policy), graceful_timeout=graceful_timeout,
            publish_to=publish_to, max_payload_bytes=self.max_payload_bytes,
            archive=archive,  # type: ignore[arg-type]  # checked by SubscriberConfig
            results=results, batch=batch, batch_wait=batch_wait,
        )

        def register(handler: Callable[..., Any]) -> Callable[..., Any]:
            self._subscribers.append(Subscriber(config, HandlerAdapter(handler, batch=bool(batch))))
            if self._started:
                self._start_one(self._subscribers[-1])
            return handler

        return register

    @property
    def subscribers(self) -> list[Subscriber]:
        return list(self._subscribers)

    @property
    def runtimes(self) -> list[SubscriberRuntime]:
        return list(self._runtimes)

    # ---- running -------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the schema and start every subscriber's loops and the periodic schedules."""
        if self._started:
            return
        await self.check_schema()
        for sub in self._subscribers:
            for pattern, group in sub.config.groups:
                await self._engine.join_group(pattern, group)
        await self._register_schedules()  # listed by schedules() once start() returns
        if self._hooks.lifecycle:
            self._hooks_started = True
            await self._hooks.started(self)
        self._started = True
        for sub in self._subscribers:
            self._start_one(sub)
        if self._subscribers:
            self._recovery = LeaseRecovery(self._engine, self._recovery_every,
                                           self.recovery_spread, self._wakeups.wake_all)
            self._recovery.start()
        await _listening(self.listener)  # a publish from now on wakes by its notification
        if self._heartbeat is not None:  # listed in workers() once start() returns
            await self._heartbeat.first_beat()
        if self._schedules:
            self._run_schedules()

    def _start_one(self, sub: Subscriber) -> None:
        runtime = SubscriberRuntime(self._engine, sub, self._wakeups.register(sub.queues),
                                    self._hooks, self._dead_letters, self._results.ended)
        self._runtimes.append(runtime)
        runtime.start()
        self._join_registry()  # this broker now shows in the live workers registry
        if self.listener is None:
            self.listener = self._engine.wake_source(self._wakeups.wake,
                                                     self._wakeups.wake_all)
            if self.listener is not None:
                self.listener.start()

    def _recovery_every(self) -> float:  # the shortest any subscriber asked for
        return min([self.recovery_interval,
                    *(s.config.recovery_interval for s in self._subscribers)])

    async def stop(self, graceful_timeout: float | None = None) -> None:
        """Graceful stop: unstarted messages go back, running handlers get their time."""
        if self.listener is not None:
            await self.listener.stop()
            self.listener = None
        await self._stop_schedules()
        if self._recovery is not None:
            await self._recovery.stop()
            self._recovery = None
        await asyncio.gather(*(r.stop(graceful_timeout) for r in self._runtimes))
        await self._dead_letters.drain()  # the hooks of the last results written
        await self._leave_registry()  # after the handlers: listed while they finish
        self._runtimes.clear()
        self._wakeups.clear()
        self._started = False
        if self._hooks_started:
            self._hooks_started = False
            await self._hooks.stopped(self)

    async def close(self) -> None:
        """Stop, and release what the engine holds (the SQLAlchemy engines sqlmq created)."""
        await self.stop()
        await self._results.close()
        await self._engine.close()

    async def __aenter__(self) -> Broker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Start, run until SIGINT/SIGTERM (or ``stop`` is set), then stop gracefully; see
        :func:`sqlmq.worker.run`."""
        from .worker import run

        await run(self, stop)


def _sqlalchemy(broker: Broker, name: str) -> Any:
    """The SQLAlchemy engine ``name`` of ``broker``'s engine (a SQL engine's, created on
    first use), or a clear error where there is none."""
    engine = getattr(broker.engine, name, None)
    if engine is None:
        raise ConfigurationError(
            f"the broker on {broker.url} has no SQLAlchemy engine ({name}): an in-memory "
            "broker keeps its messages in the process; use broker.engine to read them")
    return engine


__all__ = ["DEFAULT_MAX_PAYLOAD", "Broker"]
