"""The broker: configuration, publishing (async and sync, on its own engine or on the
caller's transaction), the registry of subscribers, and start/stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import URL
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from .backoff import Backoff
from .commit_hooks import on_commit
from .connect import create_async, create_sync, parse_url, safe_url, sync_url
from .engines import engine_for
from .engines.base import Engine, KeptConnections
from .engines.mysql import MysqlEngine
from .engines.postgres import PostgresEngine
from .engines.sqlite import SqliteEngine
from .errors import ConfigurationError, PublishError
from .migrate import check_schema, migrate
from .notify import Listener, channel_for
from .publishing import plan_insert, prepare
from .records import NewMessage, QueueStats, Settlement
from .retry import Retry, RetryStrategy
from .runtime import SubscriberRuntime
from .schema import DEFAULT_PREFIX, Schema, build_schema
from .states import AckPolicy, Outcome
from .subscriber import HandlerAdapter, Subscriber, SubscriberConfig
from .tasks import cancel_and_wait

log = logging.getLogger("sqlmq")

DEFAULT_MAX_PAYLOAD = 10 * 1024 * 1024
_CHUNK = 1000  # rows per INSERT where the database limits bound parameters


class Broker:
    """A message broker on a database you already run.

    ``target`` is a URL (``postgresql://…``, ``mysql://…``/``mariadb://…``,
    ``sqlite:///path``) or your own SQLAlchemy ``AsyncEngine`` (or sync ``Engine``, which
    then serves ``publish_sync`` only).
    """

    def __init__(
        self,
        target: str | URL | AsyncEngine | SyncEngine,
        *,
        table_prefix: str = DEFAULT_PREFIX,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        recovery_interval: float = 5.0,
        recovery_spread: float = 1.0,
    ) -> None:
        self.schema: Schema = build_schema(table_prefix)
        self.max_payload_bytes = max_payload_bytes
        self.recovery_interval = recovery_interval
        self.recovery_spread = recovery_spread
        self._db: AsyncEngine | None = None
        self._sync_db: SyncEngine | None = None
        self._owns_db = False
        self._url: URL
        self._shown_url: str | None = None
        if isinstance(target, AsyncEngine) and target.dialect.name == "sqlite":
            # SQLite needs sqlmq's connection set-up (WAL, BEGIN IMMEDIATE) to share work
            # between processes safely, so the broker opens the same file with its own engine.
            self._url = parse_url(target.url)
        elif isinstance(target, AsyncEngine):
            self._db = target
            self._url = target.url
        elif isinstance(target, SyncEngine):
            self._sync_db = target
            self._url = target.url
        elif isinstance(target, str | URL):
            self._url = parse_url(target)
            self._shown_url = safe_url(target)
        else:
            raise ConfigurationError(
                f"Broker needs a database URL or a SQLAlchemy engine, got {type(target).__name__}"
            )
        self._engine: Engine | None = None
        self._subscribers: list[Subscriber] = []
        self._runtimes: list[SubscriberRuntime] = []
        self._wakeups: dict[str, list[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the subscribers' loop
        self._maintenance: asyncio.Task[None] | None = None
        self._started = False
        #: On PostgreSQL, the LISTEN connection that wakes subscribers (while running).
        self.listener: Listener | None = None

    def __repr__(self) -> str:
        return f"Broker({self.url!r})"

    @property
    def url(self) -> str:
        """The database URL as the user gave it, with the password masked."""
        return self._shown_url or safe_url(self._url)

    @property
    def db(self) -> AsyncEngine:
        """The async SQLAlchemy engine the broker runs on (created on first use)."""
        if self._db is None:
            if self._sync_db is not None:
                raise ConfigurationError(
                    "this broker was given a synchronous Engine: only publish_sync() and "
                    "publish_batch_sync() are available; pass a URL or an AsyncEngine to consume"
                )
            self._db = create_async(self._url)
            self._owns_db = True
        return self._db

    @property
    def engine(self) -> Engine:
        """The engine contract for this database (acquire, settle, stats, …)."""
        if self._engine is None:
            self._engine = engine_for(self.db, self.schema)
        return self._engine

    @property
    def sync_db(self) -> SyncEngine:
        if self._sync_db is None:
            self._sync_db = create_sync(sync_url(self._url))
        return self._sync_db

    # ---- schema --------------------------------------------------------------------------

    async def migrate(self) -> int:
        """Create or upgrade the tables; safe to call from many processes at once."""
        return await migrate(self.db, self.schema)

    async def check_schema(self) -> None:
        await check_schema(self.db, self.schema, self.url)

    # ---- publishing ----------------------------------------------------------------------

    async def publish(
        self, queue: str, body: Any, *, headers: Mapping[str, str] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        connection: AsyncConnection | AsyncSession | None = None,
    ) -> int:
        """Publish one message; returns its id. With ``connection`` the message is part of
        the caller's transaction: it commits or rolls back with it."""
        (msg_id,) = await self.publish_batch(
            queue, [body], headers=headers, delay=delay, at=at, connection=connection
        )
        return msg_id

    async def publish_batch(
        self, queue: str, bodies: Iterable[Any], *, headers: Mapping[str, str] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        connection: AsyncConnection | AsyncSession | None = None,
    ) -> list[int]:
        """Publish many messages to one queue in one statement; returns ids in order."""
        messages = prepare(queue, bodies, headers=headers, delay=delay, at=at,
                           max_payload_bytes=self.max_payload_bytes)
        if not messages:
            return []
        if connection is not None and not isinstance(connection, AsyncConnection | AsyncSession):
            raise PublishError(
                f"publish() takes an AsyncConnection or AsyncSession, got "
                f"{type(connection).__name__}; use publish_sync() with a sync Connection/Session"
            )
        ids: list[int] = []
        if connection is None and isinstance(self.engine, PostgresEngine):
            ids = await self.engine.insert(messages)  # one statement, one round trip
        elif (connection is None and isinstance(self.engine, SqliteEngine | MysqlEngine)
              and len(messages) == 1 and messages[0].at is None):
            direct = self._idle_runtime(messages[0])
            if direct is not None:
                return [await self._publish_to(direct, messages[0])]
            ids = [await self.engine.insert_one(messages[0])]
        elif connection is None:
            async with self.db.begin() as conn:
                for plan in self._plans(conn.dialect, messages):
                    ids += plan.ids(await conn.execute(plan.statement, plan.params))
        else:
            dialect = (connection.bind.dialect if isinstance(connection, AsyncSession)
                       else connection.dialect)
            for plan in self._plans(dialect, messages):
                ids += plan.ids(await connection.execute(plan.statement, plan.params))
        self._wake_when_visible(queue, connection)
        return ids

    def _idle_runtime(self, message: NewMessage) -> SubscriberRuntime | None:
        """A subscriber of this process, on this loop, with nothing to do that would take
        ``message`` (due now) at once."""
        if message.delay > 0 or self._loop is not asyncio.get_running_loop():
            return None
        for runtime in self._runtimes:
            if runtime.takes_direct(message.queue):
                return runtime
        return None

    async def _publish_to(self, runtime: SubscriberRuntime, message: NewMessage) -> int:
        """Publish ``message`` already acquired for ``runtime`` and hand it over: one round
        trip from publish to handler, where an acquire would add another. The row is what
        an acquire leaves, leased and fenced as usual, so a crash loses nothing."""
        engine = self.engine
        assert isinstance(engine, SqliteEngine | MysqlEngine)
        d = await engine.insert_leased(message, runtime.cfg.lease)
        if not runtime.hand_over(d):  # it began to stop meanwhile: back to the queue
            await engine.settle([Settlement(d.id, d.deliveries, Outcome.RELEASE, refund=True,
                                            attempted=False)])
            self._wake_when_visible(message.queue, None)
        return d.id

    def publish_sync(
        self, queue: str, body: Any, *, headers: Mapping[str, str] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        connection: Connection | Session | None = None,
    ) -> int:
        """The synchronous twin of :meth:`publish`, for code without an event loop."""
        (msg_id,) = self.publish_batch_sync(
            queue, [body], headers=headers, delay=delay, at=at, connection=connection
        )
        return msg_id

    def publish_batch_sync(
        self, queue: str, bodies: Iterable[Any], *, headers: Mapping[str, str] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        connection: Connection | Session | None = None,
    ) -> list[int]:
        messages = prepare(queue, bodies, headers=headers, delay=delay, at=at,
                           max_payload_bytes=self.max_payload_bytes)
        if not messages:
            return []
        if connection is not None and not isinstance(connection, Connection | Session):
            raise PublishError(
                f"publish_sync() takes a sync Connection or Session, got "
                f"{type(connection).__name__}; use await publish() with async ones"
            )
        ids: list[int] = []
        if connection is None:
            with self.sync_db.begin() as conn:
                for plan in self._plans(conn.dialect, messages):
                    ids += plan.ids(conn.execute(plan.statement, plan.params))
        else:
            bind = connection.get_bind() if isinstance(connection, Session) else connection
            for plan in self._plans(bind.dialect, messages):
                ids += plan.ids(connection.execute(plan.statement, plan.params))
        self._wake_when_visible(queue, connection)
        return ids

    def _plans(self, dialect: Any, messages: list[Any]) -> list[Any]:
        if dialect.name == "postgresql":
            return [plan_insert(self.schema, dialect, messages)]
        return [
            plan_insert(self.schema, dialect, messages[i : i + _CHUNK])
            for i in range(0, len(messages), _CHUNK)
        ]

    def _wake_when_visible(self, queue: str, connection: Any) -> None:
        """Wake this process's subscribers of ``queue`` now, or, for a publish in the
        caller's transaction, when that commits."""
        if queue not in self._wakeups:
            return
        if connection is None:
            self._wake(queue)
        else:
            on_commit(connection, (id(self), queue), lambda: self._wake(queue))

    def _wake(self, queue: str) -> None:
        events = self._wakeups.get(queue)
        if events:
            self._set(events)

    def _wake_all(self) -> None:
        self._set([e for events in self._wakeups.values() for e in events])

    def _set(self, events: list[asyncio.Event]) -> None:
        # publish_sync() may run on another thread than the subscribers' loop; an Event set
        # there would not wake that loop until its next timer.
        loop = self._loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is None or here is loop:
            for event in events:
                event.set()
        elif not loop.is_closed():
            for event in events:
                loop.call_soon_threadsafe(event.set)

    # ---- subscribers ---------------------------------------------------------------------

    def subscriber(
        self,
        queues: str | Sequence[str],
        *,
        workers: int = 8,
        fetch_batch: int = 100,
        prefetch: int | None = None,
        min_fetch_interval: float = 0.0,
        max_fetch_interval: float = 1.0,
        flush_interval: float = 0.05,
        flush_batch: int = 500,
        max_unflushed: int = 10_000,
        lease: float = 30.0,
        renew_leases: bool = True,
        recovery_interval: float | None = None,
        max_deliveries: int | Literal["auto"] | None = "auto",
        retry: RetryStrategy | None = None,
        ack_policy: AckPolicy | str = AckPolicy.NACK_ON_ERROR,
        graceful_timeout: float = 30.0,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a handler for one or more queues (a decorator)."""
        # a lone non-str (7, None) must reach check_queue's clear error, not tuple()'s
        single = isinstance(queues, str) or not isinstance(queues, Iterable)
        names = (queues,) if single else tuple(queues)
        config = SubscriberConfig(
            queues=names, workers=workers, fetch_batch=fetch_batch, prefetch=prefetch,
            min_fetch_interval=min_fetch_interval, max_fetch_interval=max_fetch_interval,
            flush_interval=flush_interval, flush_batch=flush_batch, max_unflushed=max_unflushed,
            lease=lease, renew_leases=renew_leases, max_deliveries=max_deliveries,
            recovery_interval=(self.recovery_interval if recovery_interval is None
                               else recovery_interval),
            retry=retry if retry is not None else Retry.exponential(),
            ack_policy=AckPolicy(ack_policy), graceful_timeout=graceful_timeout,
        )

        def register(handler: Callable[..., Any]) -> Callable[..., Any]:
            self._subscribers.append(Subscriber(config, HandlerAdapter(handler)))
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
        """Check the schema and start every subscriber's loops."""
        if self._started:
            return
        await self.check_schema()
        self._started = True
        for sub in self._subscribers:
            self._start_one(sub)
        if self._subscribers:
            self._maintenance = asyncio.create_task(self._recovery_loop(), name="sqlmq-recovery")

    def _start_one(self, sub: Subscriber) -> None:
        self._loop = asyncio.get_running_loop()
        wakeup = asyncio.Event()
        for q in sub.queues:
            self._wakeups.setdefault(q, []).append(wakeup)
        runtime = SubscriberRuntime(self.engine, sub, wakeup)
        self._runtimes.append(runtime)
        runtime.start()
        if self.listener is None and self.db.dialect.name == "postgresql":
            self.listener = Listener(self.db, channel_for(self.schema), self._wake,
                                     self._wake_all)
            self.listener.start()

    async def stop(self, graceful_timeout: float | None = None) -> None:
        """Graceful stop: unstarted messages go back, running handlers get their time."""
        if self.listener is not None:
            await self.listener.stop()
            self.listener = None
        await cancel_and_wait(self._maintenance)
        self._maintenance = None
        await asyncio.gather(*(r.stop(graceful_timeout) for r in self._runtimes))
        self._runtimes.clear()
        self._wakeups.clear()
        self._started = False

    async def close(self) -> None:
        """Stop, and dispose of the engines sqlmq created."""
        await self.stop()
        if isinstance(self._engine, KeptConnections):
            await self._engine.close()
        if self._owns_db and self._db is not None:
            await self._db.dispose()
            self._db = None
            self._engine = None
        if self._sync_db is not None:
            self._sync_db.dispose()

    async def __aenter__(self) -> Broker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Start, run until SIGINT/SIGTERM (or ``stop`` is set), then stop gracefully.

        Start, the signal, the drain and the stop are logged at INFO: an operator reading a
        worker's log sees what it runs, on which database, and why it ended."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._on_signal, sig, stop)
                installed.append(sig)
        started = loop.time()
        try:
            await self.start()
            self._log_start()
            await stop.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            self._log_drain()
            counters = [r.counters for r in self._runtimes]
            await self.close()
            log.info("sqlmq worker stopped after %.1f s: %d completed, %d failed, %d retried, "
                     "%d given back", loop.time() - started,
                     sum(c.completed for c in counters), sum(c.failed for c in counters),
                     sum(c.retried for c in counters), sum(c.released for c in counters))

    @staticmethod
    def _on_signal(sig: signal.Signals, stop: asyncio.Event) -> None:
        log.info("received %s: stopping%s", sig.name,
                 " (already stopping)" if stop.is_set() else "")
        stop.set()

    def _log_start(self) -> None:
        log.info("sqlmq worker started on %s (table prefix %r): %d subscriber(s)", self.url,
                 self.schema.prefix, len(self._subscribers))
        for sub in self._subscribers:
            c = sub.config
            log.info("subscriber %s on %s: workers=%d fetch_batch=%d prefetch=%s lease=%gs "
                     "max_deliveries=%s retry=%r ack_policy=%s graceful_timeout=%gs",
                     sub.adapter.name, ", ".join(c.queues), c.workers, c.fetch_batch,
                     c.prefetch, c.lease, c.max_deliveries, c.retry, c.ack_policy.name,
                     c.graceful_timeout)

    def _log_drain(self) -> None:
        if not self._runtimes:
            return
        running = sum(r.running for r in self._runtimes)
        buffered = sum(r.buffered for r in self._runtimes)
        log.info("draining: %d handler(s) running get up to %gs to finish, %d fetched "
                 "message(s) not started go back to the queue", running,
                 max(r.cfg.graceful_timeout for r in self._runtimes), buffered)

    async def _recovery_loop(self) -> None:
        backoff = Backoff("recovery of expired leases")
        while True:
            try:
                recovered = await self.engine.recover_expired(1000, self.recovery_spread)
            except Exception as exc:
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            if recovered:
                log.info("recovered %d message(s) whose lease expired", len(recovered))
                for event in {e for events in self._wakeups.values() for e in events}:
                    event.set()
                if len(recovered) == 1000:
                    continue
            await asyncio.sleep(self._recovery_every())

    def _recovery_every(self) -> float:
        """The shortest recovery interval any subscriber asked for."""
        return min([self.recovery_interval,
                    *(s.config.recovery_interval for s in self._subscribers)])

    # ---- insights ------------------------------------------------------------------------

    async def stats(self) -> list[QueueStats]:
        return await self.engine.stats()
