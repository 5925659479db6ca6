"""The callers of one broker waiting for messages to end, and the one task that reads for
them all.

Each waiter registers its message id and a future. One task reads the ids of every waiter
in one statement (``Engine.answers``) whenever there may be news, and resolves the futures
of the messages that ended (or are nowhere). News is, by what the database offers:

* the ``answer_source`` of the engine (PostgreSQL: a LISTEN on the prefix's result channel,
  which every settle that ends an awaited message, and every cancel, notifies at its
  commit), whose reconnects read again;
* this process's own settles and cancels (:meth:`ResultWatch.ended`);
* a change of the engine's commit counter (SQLite's ``data_version``, the in-memory
  engine's writes), looked at every few milliseconds as the fetcher does;
* a new waiter (its message may have ended already).

Where none of these covers other processes (MariaDB, or PostgreSQL while its listening
connection is down), the task polls, at intervals that grow with the youngest waiter's
age (a quarter of it, 5 ms to 1 s: a late answer costs at most a quarter of the wait),
never in a tight loop. With push, a slow safety poll (every second) still finds endings
that announce nothing (a purge, retention, an older sqlmq).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..backoff import Backoff
from ..errors import ConfigurationError, ResultError
from ..tasks import cancel_and_wait, loop_task

if TYPE_CHECKING:
    from ..engines.contract import AnswerSource, Engine
    from ..records import Answer

log = logging.getLogger("sqlmq")

#: The shortest and longest wait between two reads of a polling watch.
POLL_MIN = 0.005
POLL_MAX = 1.0
#: The share of its youngest waiter's age a polling watch waits before it reads again.
POLL_SHARE = 0.25
#: Between two reads while push notices (or a commit counter) bring the news.
SAFETY_POLL = 1.0
#: How often the commit counter is looked at (as the fetcher's, see runtime.fetcher).
COMMIT_WATCH_INTERVAL = 0.005
#: How many of the ids that ended lately a watch remembers (see ``ResultWatch.wait``).
RECENT = 4096


def poll_interval(age: float) -> float:
    """How long a poller waits before reading again for a waiter that has waited ``age``
    seconds: a quarter of it, within ``POLL_MIN`` and ``POLL_MAX``."""
    return min(POLL_MAX, max(POLL_MIN, age * POLL_SHARE))


class ResultWatch:
    """The waiting callers of one broker (on one event loop) and their reads."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._waiters: dict[int, list[asyncio.Future[Answer | None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._news: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._source: AnswerSource | None = None
        self._youngest = 0.0  # loop time of the last waiter's arrival
        self._commits: Callable[[], int | None] | None = None
        #: The ids that ended lately, as this process and the push source told: a fresh
        #: message ended before its caller began to wait is read at once (see :meth:`wait`).
        self._recent: dict[int, None] = {}
        self.reads = 0  # how many reads were made: tests and benchmarks look

    @property
    def waiting(self) -> int:
        return sum(len(f) for f in self._waiters.values())

    async def wait(self, msg_id: int, patience: float | None,
                   fresh: bool = False) -> Answer | None:
        """Message ``msg_id``'s answer once it ended (None: it is nowhere), or TimeoutError
        after ``patience`` seconds (None: no limit). ``fresh``: the caller published it
        just now, so where push notices come (a connected listener), its ending will be
        announced after this call and no read is made until then, unless it was announced
        already; otherwise a read is made at once, as it may have ended."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._move_to(loop)
        future: asyncio.Future[Answer | None] = loop.create_future()
        self._waiters.setdefault(msg_id, []).append(future)
        self._youngest = loop.time()
        self._start()
        if not (fresh and self._pushes()) or msg_id in self._recent:
            self._poke()
        try:
            return await asyncio.wait_for(future, patience)
        finally:
            waiting = self._waiters.get(msg_id)
            if waiting is not None:
                if future in waiting:
                    waiting.remove(future)
                if not waiting:
                    del self._waiters[msg_id]
            if not self._waiters and self._task is not None:
                self._poke()  # the task ends now rather than at its next read

    def ended(self, ids: list[int]) -> None:
        """Messages ``ids`` ended (this process settled or cancelled them, or a notice came):
        read again if any is waited for. Any thread may call it."""
        recent = self._recent
        for msg_id in ids:
            recent[msg_id] = None
        while len(recent) > RECENT:
            del recent[next(iter(recent))]
        if not self._waiters or not any(i in self._waiters for i in ids):
            return
        self._poke_threadsafe()

    async def close(self) -> None:
        """Stop the reads and the push source. A caller still waiting gets a
        :class:`~sqlmq.errors.ResultError` saying the broker closed."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        source, self._source = self._source, None
        if source is not None:
            await source.stop()
        for msg_id, futures in self._waiters.items():
            for future in futures:
                if not future.done():
                    future.set_exception(ResultError(
                        f"the broker closed while a caller waited for message {msg_id}",
                        msg_id, None))
        self._waiters.clear()

    # ---- the reads ---------------------------------------------------------------------

    def _start(self) -> None:
        if self._commits is None:
            self._commits = self._engine.commit_counter() or (lambda: None)
        if self._source is None:
            self._source = self._engine.answer_source(self.ended, self._poke)
            if self._source is not None:
                self._source.start()
        if self._task is None:
            self._task = loop_task(self._run, "sqlmq-results", lambda: False)

    async def _run(self) -> None:
        backoff = Backoff("reading the results awaited")
        assert self._news is not None and self._commits is not None
        news, commits = self._news, self._commits
        seen = commits()
        while True:
            if not self._waiters:
                self._task = None  # no await since the check: a new waiter starts another
                news.clear()  # and says whether to read at once
                return
            if not news.is_set():
                await self._until_news(seen)
                if not self._waiters:
                    continue
            news.clear()
            seen = commits()
            ids = list(self._waiters)
            try:
                found = await self._engine.answers(ids)
            except Exception as exc:
                await backoff.failed(exc)  # logged once, with the database's answer
                news.set()  # read again after the backoff, whatever the notices say
                continue
            backoff.succeeded()
            self.reads += 1
            for msg_id in ids:
                answer = found.get(msg_id)
                if answer is None or answer.ended:
                    for future in self._waiters.pop(msg_id, ()):
                        if not future.done():
                            future.set_result(answer)

    async def _until_news(self, seen: int | None) -> None:
        """Until there may be news: a poke, a commit counter that moved, or the time a
        read is due anyway."""
        assert self._news is not None and self._commits is not None
        loop = asyncio.get_running_loop()
        watching = seen is not None
        pushed = watching or self._pushes()
        wait = SAFETY_POLL if pushed else poll_interval(loop.time() - self._youngest)
        deadline = loop.time() + wait
        step = COMMIT_WATCH_INTERVAL if watching else wait
        while (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._news.wait(), min(left, step))
                return
            except TimeoutError:
                pass
            if watching and self._commits() != seen:
                return

    def _pushes(self) -> bool:
        """Whether push notices come now (a connected listening connection)."""
        return self._source is not None and self._source.connected.is_set()

    def _poke(self) -> None:
        if self._news is not None:
            self._news.set()

    def _poke_threadsafe(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._poke()
        else:
            loop.call_soon_threadsafe(self._poke)

    def _move_to(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve waiters on ``loop`` from now on (a broker used from another event loop
        than before: the last one's task and listener are gone with it)."""
        if self._loop is not None and not self._loop.is_closed() and self._waiters:
            raise ConfigurationError("this broker's callers wait for results on another "
                                     "event loop already: use one broker per event loop")
        self._task = None
        self._source = None
        self._waiters.clear()
        self._loop = loop
        self._news = asyncio.Event()


__all__ = ["ResultWatch", "poll_interval"]
