"""The live workers registry: each running broker (one that has started subscribers) keeps a
row of ``{prefix}worker`` fresh, so that operators see which processes consume, where, with
which subscribers and settings, and how busy they are (``await broker.workers()``).

Every ``interval`` seconds a beat writes the row: ``heartbeat_at`` now and ``expires_at``
:data:`MISSED_BEATS` intervals later (the database clock), with the subscribers and their
counts. A row whose ``expires_at`` has passed is a process that died without stopping (a
SIGKILL, a lost host): it is no longer listed, and the next beat of any broker deletes it,
so dead rows age out with no sweeper of their own. A stop deletes the row at once.

Three intervals, and each row's own: a broker whose beat is late by up to two intervals (a
loaded host, a slow database) stays listed, and brokers beating at different intervals
judge each other by the writer's interval. A database fault backs the loop off and is
logged (with its traceback if it is not a database error); the loop never ends before
:meth:`Heartbeat.stop`, and a task that ended anyway is logged.

**Leading.** The registry also elects the process that does the duties one process does
for all (the archive's retention, :mod:`sqlmq.maintenance.retention`; the queue-depth
gauges of :mod:`sqlmq.metrics`): the live worker that started first (by ``started_at``,
then id). Each beat reads the live rows and sets :attr:`Heartbeat.leading`. When the leader
stops, its row goes at once and the next-oldest takes over at its next beat; when it dies,
its row expires first (:data:`MISSED_BEATS` intervals). A leader's belief is a lease: it
lasts :data:`MISSED_BEATS` intervals from the moment its last beat was sent, the least time
the others take to judge its row dead, so a process that stalls (a loaded host, a long
pause) stops leading before another can start, and does not act on a stale belief when it
wakes. Two processes can both lead only when their clocks disagree on how fast time
passes, and both duties are safe to run twice anyway (deleting expired archive rows;
reading counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from importlib import metadata
from typing import Any

from ..backoff import Backoff, describe
from ..engines.contract import Engine
from ..records import WorkerBeat
from ..tasks import cancel_and_wait

log = logging.getLogger("sqlmq")

#: A row is believed for this many heartbeat intervals after its last beat.
MISSED_BEATS = 3
#: How long a stop waits for a beat in progress before cutting it short (seconds).
STOP_TIMEOUT = 10.0
#: How long a start waits for its first beat (seconds).
FIRST_BEAT_WAIT = 10.0

#: What a beat reports of the broker: its subscribers' descriptions and counts.
Describe = Callable[[], "tuple[list[dict[str, Any]], int, int]"]


def sqlmq_version() -> str:
    """The installed sqlmq package's version ("unknown" when run from a bare checkout)."""
    try:
        return metadata.version("sqlmq")
    except metadata.PackageNotFoundError:
        return "unknown"


class Heartbeat:
    """Keeps one broker's row of the workers registry fresh on ``engine`` every
    ``interval`` seconds; ``describe()`` gives its subscribers (JSON-ready dicts) and its
    running and held counts at each beat."""

    def __init__(self, engine: Engine, interval: float, describe: Describe) -> None:
        self.engine = engine
        self.interval = interval
        self.describe = describe
        #: This broker's row, new for each start.
        self.id = str(uuid.uuid4())
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.version = sqlmq_version()
        self._leading = False  # as of its last beat
        self._lease_ends = 0.0  # time.monotonic() when that belief lapses
        #: Beats written, and dead rows deleted by them.
        self.beats = 0
        self.swept = 0
        self._stopping = asyncio.Event()
        self._tried = asyncio.Event()  # the first beat has been tried
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sqlmq-heartbeat")
            self._task.add_done_callback(self._ended)

    async def first_beat(self) -> bool:
        """Wait (up to :data:`FIRST_BEAT_WAIT` seconds) until the first beat has been
        tried, so that a broker is listed once its ``start()`` returns; whether it was
        written (if not, the loop goes on trying, with backoff)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._tried.wait(), FIRST_BEAT_WAIT)
        return self.beats > 0

    async def stop(self) -> None:
        """Let a beat in progress finish (a cancel inside a statement can leave SQLite's
        write lock held until the connection is collected), end the loop, then delete the
        row. A row that cannot be deleted (the database is down) ages out."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping.set()
        self._leading = False
        await asyncio.wait([task], timeout=STOP_TIMEOUT)
        await cancel_and_wait(task)
        try:
            await self.engine.leave(self.id)
        except Exception as exc:
            log.warning("could not remove worker %s from the workers registry (%s); its row "
                        "ages out in %.0f s", self.id, describe(exc),
                        MISSED_BEATS * self.interval)

    @property
    def leading(self) -> bool:
        """Whether this broker leads the live workers (see the module): it did at its last
        beat, and that beat was sent less than :data:`MISSED_BEATS` intervals ago."""
        return self._leading and time.monotonic() < self._lease_ends

    def beat_now(self) -> WorkerBeat:
        """What the next beat writes."""
        subscribers, running, held = self.describe()
        return WorkerBeat(self.id, self.host, self.pid, self.version, subscribers, running,
                          held, MISSED_BEATS * self.interval)

    async def _run(self) -> None:
        backoff = Backoff("the heartbeat of the workers registry")
        while not self._stopping.is_set():
            sent = time.monotonic()  # the row expires no sooner than this plus its ttl
            try:
                swept = await self.engine.heartbeat(self.beat_now())
                live = await self.engine.workers()
            except Exception as exc:
                self._leading = False  # unsure of its own row: let another lead meanwhile
                self._tried.set()
                await backoff.failed(exc)
                continue
            first = min(live, key=lambda w: (w.started_at, w.id), default=None)
            leading = first is not None and first.id == self.id and not self._stopping.is_set()
            if leading != self._leading:
                log.info("worker %s %s the live workers (it does the duties one process does "
                         "for all)", self.id, "now leads" if leading else "no longer leads")
            self._leading = leading
            self._lease_ends = sent + MISSED_BEATS * self.interval
            backoff.succeeded()
            self.beats += 1
            self._tried.set()
            if swept:
                self.swept += swept
                log.info("removed %d dead worker(s) from the workers registry (no heartbeat "
                         "for too long)", swept)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A loop that ended on its own (it should not) says so."""
        if task.cancelled() or self._stopping.is_set():
            return
        exc = task.exception()
        log.error("the heartbeat of the workers registry stopped: %s; this broker will not "
                  "be listed as a live worker", "ended" if exc is None else describe(exc),
                  exc_info=exc)


__all__ = ["MISSED_BEATS", "Heartbeat", "sqlmq_version"]
