"""The driver's hold on one consumer name, composed of its ownership (claim, heartbeat,
release), its leases and its acknowledgements, with a keeper thread that beats and extends.

The driver keeps a heartbeat on the consumer row (one running query per consumer name) and
extends the leases it holds, so they outlive a restart as long as the restart comes within
``leaseSeconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import func, literal, select

from ..engines.spark import Lease, ledger_for
from ..sqltime import db_now_plus
from .acks import Acknowledgements
from .faults import fault
from .leasing import Leasing
from .options import StreamOptions
from .ownership import Ownership, closed, release_on_sigterm

log = logging.getLogger("sqlmq.spark")
T = TypeVar("T")


class LoopThread:
    """An asyncio loop on a daemon thread, for the engine's async contract from sync code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sqlmq-spark-loop",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class Consumer:
    """The driver's hold on one consumer name: ownership, leases and acknowledgements."""

    def __init__(self, options: StreamOptions) -> None:
        from ..broker import Broker

        self.o = options
        db = options.db
        self.ledger = ledger_for(db.sql_engine(), db.schema, checkpoint=fault)
        self.owner = Ownership(options)
        self._io = LoopThread()
        self._broker = Broker(db.url, table_prefix=db.prefix)
        # One thread, so acknowledgements and leases ahead run one at a time, in order.
        self._background = ThreadPoolExecutor(1, thread_name_prefix="sqlmq-spark-ahead")
        self.leasing = Leasing(options, self.ledger, self.owner, lambda: self._broker.engine,
                               self._io.run, self._background)
        self.acks = Acknowledgements(options, self.ledger, self.owner, self._background)
        self.owner.claim()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self._keeper = threading.Thread(target=self._keep, name="sqlmq-spark-keeper",
                                        daemon=True)
        self._keeper.start()
        release_on_sigterm(self)

    # ---- what the stream reader asks -------------------------------------------------------

    def acked_seq(self) -> int:
        return self.owner.acked_seq()

    def ready_count(self) -> int:
        """Messages of the queue ready now (what ``availableNow`` runs up to)."""
        m = self.o.db.schema.message
        with self.ledger.sql_engine.connect() as conn:
            return conn.execute(
                select(func.count()).select_from(m).where(
                    m.c.queue == self.o.queue,
                    m.c.next_attempt_at <= db_now_plus(literal(0.0)),
                )
            ).scalar_one()

    def release_unlogged(self, start: int) -> None:
        self.leasing.release_unlogged(start)

    def lease_next(self, start: int, limit: int | None) -> tuple[int, int]:
        return self.leasing.lease_next(start, limit)

    def lease_ahead(self, last: int, limit: int) -> None:
        self.leasing.lease_ahead(last, limit)

    @property
    def ahead(self) -> Future[int] | None:
        """The lease ahead under way, if any."""
        return self.leasing.ahead

    def leased(self, start: int, end: int) -> list[Lease]:
        return self.leasing.leased(start, end)

    def acknowledge(self, upto: int) -> None:
        self.acks.acknowledge(upto)

    def acknowledge_later(self, upto: int) -> None:
        """Acknowledge sequences ``<= upto`` on the background thread (see
        :class:`Acknowledgements`); their leases are never read again."""
        self.acks.wait(block=False)
        self.leasing.forget(upto)
        self.acks.later(upto)

    def wait_acks(self, block: bool = True) -> None:
        self.acks.wait(block)

    # ---- keeping and closing ---------------------------------------------------------------

    def _keep(self) -> None:
        """Heartbeat every consumerTimeout/3; extend held leases and recover expired ones
        (of crashed consumers) every leaseSeconds/6."""
        beat_every = self.o.consumer_timeout / 3
        extend_every = self.o.lease / 6
        last_extend = time.monotonic()
        while not self._closed.wait(beat_every):
            try:
                self.owner.beat()
                if time.monotonic() - last_extend >= extend_every:
                    last_extend = time.monotonic()
                    self.leasing.extend()
                    self._io.run(self._broker.engine.recover_expired(1000))
            except Exception as exc:
                log.warning("sqlmq stream %s: keeper failed: %s", self.o.consumer, exc)

    def close(self) -> None:
        """Give the name back so a restart does not wait for the heartbeat to go stale.
        Safe to call from two threads (the SIGTERM release and Spark's ``stop()``): the
        second call returns once the first is done."""
        with self._close_lock:
            if self._closed.is_set():
                return
            with contextlib.suppress(Exception):
                self.acks.wait()
            self._closed.set()
            self.owner.release()
            self._background.shutdown(wait=False)
            with contextlib.suppress(Exception):
                self._io.run(self._broker.close())
            self._io.close()
        closed(self)
