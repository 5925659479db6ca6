"""One running query per consumer name: the consumer row's owner token and heartbeat, and
its release when the driver stops (on Spark's SIGTERM too).

The statements here are SQLAlchemy Core on the consumer row, the same on every database.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from typing import Any, Protocol

from sqlalchemy import insert, literal, select, update
from sqlalchemy.exc import IntegrityError

from ..errors import ConfigurationError, SqlmqError
from ..sqltime import db_now_plus
from .options import StreamOptions


class ConsumerBusy(SqlmqError):
    """Another running query holds this consumer name."""


class Ownership:
    """This driver's hold on the consumer row: claimed at start, kept by heartbeats (see the
    consumer's keeper), given back on close. A driver that misses its heartbeats and finds
    the name taken over stops leasing and acknowledging (:meth:`check`)."""

    def __init__(self, options: StreamOptions) -> None:
        self.o = options
        self.token = uuid.uuid4().hex
        self.lost: str | None = None

    def claim(self) -> None:
        """Own the consumer row, waiting for a previous owner's heartbeat to go stale (a
        restarted query's old driver process may not have released it)."""
        timeout = self.o.consumer_timeout
        deadline = time.monotonic() + timeout * 4 / 3
        while True:
            try:
                age = self._try_claim()
            except IntegrityError:  # another query inserted the row first
                age = 0.0
            if age is None:
                return
            if time.monotonic() > deadline:
                raise ConsumerBusy(
                    f"consumer {self.o.consumer!r} (queue {self.o.queue!r}) is held by another "
                    f"running query (heartbeat {age:.1f}s ago); stop that query or use another "
                    "option('consumer', ...)"
                )
            time.sleep(min(1.0, timeout / 5))

    def _try_claim(self) -> float | None:
        """Claim the row if it is free or stale; else the age of its owner's heartbeat."""
        c = self.o.db.schema.spark_consumer
        with self.o.db.sql_engine().begin() as conn:
            now = conn.execute(select(db_now_plus(literal(0.0)))).scalar_one()
            row = conn.execute(
                select(c).where(c.c.consumer == self.o.consumer).with_for_update()
            ).first()
            if row is None:
                conn.execute(insert(c).values(
                    consumer=self.o.consumer, queue=self.o.queue, owner=self.token,
                    heartbeat_at=now, leased_seq=0, acked_seq=0,
                ))
                return None
            if row.owner not in (None, self.token) and row.heartbeat_at is not None:
                age = (now - row.heartbeat_at).total_seconds()
                if age < self.o.consumer_timeout:
                    return age
            if row.queue != self.o.queue and row.leased_seq > row.acked_seq:
                raise ConfigurationError(
                    f"consumer {self.o.consumer!r} still holds unacknowledged messages of queue "
                    f"{row.queue!r}; it cannot switch to {self.o.queue!r} (use another name)"
                )
            conn.execute(update(c).where(c.c.consumer == self.o.consumer).values(
                owner=self.token, heartbeat_at=now, queue=self.o.queue))
        return None

    def beat(self) -> None:
        c = self.o.db.schema.spark_consumer
        with self.o.db.sql_engine().begin() as conn:
            done = conn.execute(
                update(c).where(c.c.consumer == self.o.consumer, c.c.owner == self.token)
                .values(heartbeat_at=db_now_plus(literal(0.0)))
            ).rowcount
        if not done:
            self.lost = (f"consumer {self.o.consumer!r} was taken over by another query "
                         "(this driver missed its heartbeats)")

    def check(self) -> None:
        """Raise :class:`ConsumerBusy` once the name is lost (or the stream is stopping)."""
        if self.lost:
            raise ConsumerBusy(self.lost)

    def release(self) -> None:
        """Give the name back (no new leases from here), so that a restart does not wait for
        the heartbeat to go stale. Best effort: a failure leaves the heartbeat to expire."""
        self.lost = self.lost or "the stream is stopping"
        c = self.o.db.schema.spark_consumer
        with contextlib.suppress(Exception), self.o.db.sql_engine().begin() as conn:
            conn.execute(update(c).where(c.c.consumer == self.o.consumer,
                                         c.c.owner == self.token).values(owner=None))

    def acked_seq(self) -> int:
        """The last sequence acknowledged under this name."""
        c = self.o.db.schema.spark_consumer
        with self.o.db.sql_engine().connect() as conn:
            return conn.execute(
                select(c.c.acked_seq).where(c.c.consumer == self.o.consumer)
            ).scalar_one()


class Closeable(Protocol):
    def close(self) -> None: ...


_RELEASE_TIMEOUT = 15.0
_open: set[Closeable] = set()  # this process's consumers, released on SIGTERM
_handler_installed = False


def closed(consumer: Closeable) -> None:
    """``consumer`` is closed: nothing to release on SIGTERM any more."""
    _open.discard(consumer)


def release_on_sigterm(consumer: Closeable) -> None:
    """Spark ends the driver-side Python process of a stopped query with SIGTERM (twice,
    a few milliseconds apart); release the consumer name then, so that a restart does not
    wait for a stale heartbeat.

    The signal may arrive while the main thread is inside a transaction holding the
    consumer's row lock. Releasing from the handler itself would wait for that lock
    forever (the main thread cannot resume until the handler returns), leaving a process
    that holds locks on the queue's tables. So the release runs on its own thread while the
    main thread finishes what it was doing, and the process exits when the release is
    done, or after ``_RELEASE_TIMEOUT`` whatever happens. Further SIGTERMs are ignored
    meanwhile: with the default action the second one would kill the process before the
    release."""
    global _handler_installed
    _open.add(consumer)
    if _handler_installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return  # the application handles SIGTERM itself
    releasing: list[bool] = []

    def release_and_exit(code: int) -> None:
        try:
            for c in list(_open):
                with contextlib.suppress(Exception):
                    c.close()
        finally:
            os._exit(code)

    def handler(signum: int, frame: Any) -> None:
        if releasing:
            return
        releasing.append(True)
        deadline = threading.Timer(_RELEASE_TIMEOUT, os._exit, args=(128 + signum,))
        deadline.daemon = True
        deadline.start()
        threading.Thread(target=release_and_exit, args=(128 + signum,),
                         name="sqlmq-spark-release").start()

    signal.signal(signal.SIGTERM, handler)
    _handler_installed = True
