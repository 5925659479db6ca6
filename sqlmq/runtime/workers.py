"""The worker pool: the tasks that run a subscriber's handler, one delivery at a time each."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import DecodeError
from ..lifecycle import (
    Ending,
    Outcome,
    Settlement,
    decide,
    error_text,
    exceeds_max_deliveries,
    storable,
    unrunnable,
)
from ..message import LeaseHandle, Message
from ..middleware import NO_HOOKS, Hooks, capture_context
from ..records import Delivery
from ..results.keeping import Announcer
from ..tracebacks import handler_traceback
from .buffer import WorkBuffer
from .carried import carried
from .flusher import Flusher
from .lease_deadlines import LeaseRanOut, within_lease
from .leases import Holdings
from .quarantine import Quarantine, is_suspect

if TYPE_CHECKING:
    from ..subscriber import HandlerAdapter, SubscriberConfig

log = logging.getLogger("sqlmq")

_YIELD_EVERY = 32  # messages a worker runs back to back before it lets the loop go round
_COMPLETE = Outcome.COMPLETE


class Workers:
    """``workers`` tasks that each take a delivery from the buffer, run its handler (a
    suspect through the quarantine), turn what happened into a settlement with
    :func:`~sqlmq.lifecycle.decide`, log a failure once, and record the settlement with the
    flusher. They count the handlers in flight; one that ends other than through
    :meth:`stop` is logged and replaced, its delivery given back."""

    def __init__(self, cfg: SubscriberConfig, adapter: HandlerAdapter, name: str,
                 buffer: WorkBuffer[Delivery | None], room: Callable[[], None],
                 holdings: Holdings, leases: LeaseHandle, flusher: Flusher,
                 quarantine: Quarantine, hooks: Hooks = NO_HOOKS) -> None:
        self.cfg = cfg
        self.adapter = adapter
        self._hooks = hooks
        #: The handler inside the middleware's ``handle`` hooks (the adapter itself when
        #: there are none: the hot path is unchanged).
        self._call = hooks.wrap(adapter) if hooks.handle else adapter
        #: A pipeline step whose output goes through ``publish`` hooks publishes it in the
        #: context its handler ran in (inside the middleware's, e.g. its span), kept here
        #: by message until its result is made.
        self._contexts: dict[int, contextvars.Context] | None = None
        if hooks.publish and hooks.handle and cfg.publish_to is not None:
            self._contexts = {}
            self._call = hooks.wrap(capture_context(adapter, self._contexts))
        self.name = name
        #: Marks the settlements a caller may wait for (see :mod:`sqlmq.results`).
        self._announcer = Announcer(cfg.results, adapter.name)
        self.buffer = buffer
        self._room = room  # a delivery left the buffer: the fetcher may fetch again
        self._holdings = holdings
        self._leases = leases
        self._flusher = flusher
        self._quarantine = quarantine
        self.tasks: list[asyncio.Task[None]] = []
        self.running = 0  # handlers in flight
        self.idle = asyncio.Event()  # set while none runs (the quarantine waits on it)
        self.idle.set()
        self.stopping = False

    def start(self) -> None:
        self.tasks = [self._start(i) for i in range(self.cfg.workers)]

    async def stop(self, grace: float) -> None:
        """Tell every worker to end once the buffer is empty; cancel those still running a
        handler after ``grace`` seconds."""
        for _ in self.tasks:
            self.buffer.put_nowait(None)
        if not self.tasks:
            return
        _, pending = await asyncio.wait(self.tasks, timeout=grace)
        if pending:
            log.warning("%d handler(s) of %s still running after %.1fs; cancelling them",
                        len(pending), self.name, grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # ---- the worker loop -----------------------------------------------------------------

    async def _worker(self) -> None:
        buffer, room = self.buffer, self._room
        streak = 0
        while True:
            if streak >= _YIELD_EVERY:
                # Handlers that never wait would keep the event loop to themselves while the
                # buffer lasts: yield now and then so that fetch and flush round trips, and
                # their replies, go on meanwhile.
                streak = 0
                await asyncio.sleep(0)
            streak += 1
            d = await buffer.get()
            room()
            if d is None:
                return
            try:
                await self._take(d)
            except Exception as exc:
                self._worker_failed(d, exc)
            except BaseException as exc:
                if not self.stopping:  # stop() gives back what it cut short itself
                    self._abandon(d, exc)
                raise

    async def _take(self, d: Delivery) -> None:
        key = (d.id, d.deliveries)
        lost = self._holdings.lost
        if key in lost:  # the lease was lost before we started: not ours to run
            lost.discard(key)
            self._holdings.held.pop(key, None)
            return
        if not self._quarantine.gate.is_set():  # a suspect runs alone: hand this one back
            self._flusher.add(decide(d, self.cfg, ending=Ending.UNSTARTED))
            return
        if is_suspect(d.history) and not exceeds_max_deliveries(d, self.cfg):
            await self._quarantine.run_alone(d, self.run, self.idle)
            return
        settlement = await self.run(d)
        if settlement is not None:  # None: its lease ran out, nothing to write
            await self._flusher.record(settlement)

    def _worker_failed(self, d: Delivery, exc: Exception) -> None:
        """A fault of sqlmq's own (or one no handler guard caught) while handling ``d``: log
        it with its traceback, give the delivery back and carry on with the next message,
        rather than let the worker task end unseen while its lease is renewed for ever."""
        log.error("worker of %s failed handling message %d (delivery %d): %s; giving the "
                  "message back and carrying on", self.name, d.id, d.deliveries,
                  error_text(exc), exc_info=exc)
        self._abandon(d, exc)

    def _abandon(self, d: Delivery, error: BaseException) -> None:
        """Give ``d`` back (PENDING, a delivery spent, after ``ABANDON_DELAY``) unless a result
        is already waiting or written. Its lease is no longer renewed once this is flushed;
        ``max_deliveries`` ends a message that fails this way every time."""
        key = (d.id, d.deliveries)
        if key not in self._holdings.held or self._flusher.settling(key):
            return
        self._flusher.add(decide(d, self.cfg, error, ending=Ending.ABANDONED), soon=True)

    def _start(self, i: int) -> asyncio.Task[None]:
        task = asyncio.create_task(self._worker(), name=f"sqlmq-worker-{i} {self.name}")
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        """No worker ends unseen: one that ends other than through stop() (cancelled from
        outside, or an error the loop could not catch) is logged and replaced."""
        if self.stopping or task not in self.tasks:
            return
        exc = None if task.cancelled() else task.exception()
        log.error("%s ended unexpectedly (%s); starting another in its place",
                  task.get_name(), "cancelled" if exc is None else error_text(exc),
                  exc_info=exc)
        i = self.tasks.index(task)
        self.tasks[i] = self._start(i)

    # ---- one delivery --------------------------------------------------------------------

    async def run(self, d: Delivery) -> Settlement | None:
        """Handle ``d`` to its settlement, counted as running meanwhile; None if its handler
        was cancelled because its lease ran out (nothing to write)."""
        self.running += 1
        self.idle.clear()
        try:
            settlement = await self._process(d)
            if settlement is not None:
                self._announcer.mark(settlement, d.headers)
            return settlement
        finally:
            self.running -= 1
            if self.running == 0:
                self.idle.set()

    async def _process(self, d: Delivery) -> Settlement | None:
        cfg = self.cfg
        ending = unrunnable(d, cfg)
        if ending is not None:
            return self._unrun(d, ending)
        msg = Message(d, self._leases)
        error: BaseException | None = None
        result = None
        try:
            if cfg.renew_leases and d.renewed_until is not None:
                result = await within_lease(self._call, msg, d, self._holdings.deadlines)
            else:
                result = await self._call(msg)
        except LeaseRanOut:  # nothing to write: the message comes back after its lease
            self._holdings.ran_out_while_running(d, self._flusher.counters, self.adapter.name,
                                                 cfg.lease)
            return None
        except DecodeError as exc:
            if msg.decision is None:
                log.error("message %d of queue %s dead-lettered (archived FAILED) before its "
                          "handler ran: %s", d.id, d.queue, exc)
                return decide(d, cfg, exc, ending=Ending.UNDECODABLE_BODY)
            error = exc
        except Exception as exc:
            error = exc
        except asyncio.CancelledError as exc:
            # Raised by the handler itself (an inner timeout, a task it awaited), not by
            # stop(): a failure like any other, or the worker task would end with it.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            error = exc
        finally:
            context = None if self._contexts is None else self._contexts.pop(id(msg), None)
        hooks = self._hooks
        publish_output = None if not hooks.publish else (
            lambda outputs: hooks.publish_output(outputs, msg, context))
        settlement, error, decision = carried(d, cfg, self.adapter.name, error, msg.decision,
                                              result, publish_output)
        if error is not None:
            self._report(d, error, settlement)
        elif decision is None and settlement.outcome is not _COMPLETE:
            log.warning("handler %s returned without settling message %d under the MANUAL "
                        "ack policy; treating it as a nack", self.adapter.name, d.id)
        return settlement

    def _unrun(self, d: Delivery, ending: Ending) -> Settlement:
        """Settle a delivery that must not run (an undecodable row, an expired message, too
        many deliveries)."""
        if ending is Ending.EXPIRED:  # what its publisher asked for: not an error
            log.info("message %d of queue %s expired at %s before it ran; archiving it "
                     "EXPIRED", d.id, d.queue, d.expires_at)
        elif ending is Ending.CANCELLED:
            log.info("message %d of queue %s was cancelled; archiving it CANCELLED without "
                     "running it", d.id, d.queue)
        elif ending is Ending.UNDECODABLE_ROW:
            log.error("message %d of queue %s (delivery %d), %s; archiving it FAILED", d.id,
                      d.queue, d.deliveries, storable(d.defect or "undecodable row"))
        else:
            log.error("message %d of queue %s dead-lettered (archived FAILED) without running "
                      "handler %s: max deliveries exceeded (%d > %s); it ended %d deliveries "
                      "without a result", d.id, d.queue, self.adapter.name, d.deliveries,
                      self.cfg.max_deliveries, d.deliveries - 1 - d.attempts - d.defers)
        return decide(d, self.cfg, ending=ending)

    def _report(self, d: Delivery, error: BaseException, s: Settlement) -> None:
        """One log line per failed handler run, with its traceback: what failed, which
        attempt, and what happens next. WARNING while a retry is left, ERROR when the
        message is dead-lettered (archived FAILED)."""
        where = (f"handler {self.adapter.name} failed on message {d.id} of queue {d.queue} "
                 f"(attempt {d.attempts + 1}, delivery {d.deliveries}): {error_text(error)}")
        if s.outcome is Outcome.RETRY:
            _log_failure(logging.WARNING, f"{where}; retrying in {s.delay:.3g}s", error)
        elif s.outcome is Outcome.FAIL:
            first_line = (s.error or "").split("\n", 1)[0]
            _log_failure(logging.ERROR, f"{where}; dead-lettered (archived FAILED): "
                         f"{first_line}", error)
        elif s.outcome is Outcome.COMPLETE:
            _log_failure(logging.WARNING,
                         f"{where}; archived COMPLETED all the same (acknowledged)", error)
        elif s.outcome is Outcome.CANCEL:
            log.info("%s; archived CANCELLED (its cancellation was asked for)", where)
        else:
            _log_failure(logging.WARNING, f"{where}; released", error)


def _log_failure(level: int, text: str, error: BaseException) -> None:
    """Log ``text`` with ``error``'s traceback. A user's exception may carry text no log
    stream can encode (a lone surrogate): the record would then fail in every handler that
    writes it (and crash a test runner's worker). Such a traceback is logged escaped, as the
    archive stores it, instead of as ``exc_info``. Either way the traceback starts where the
    archive's does: at the user's code, when they raised it."""
    info = (type(error), error, handler_traceback(error))
    trace = "".join(traceback.format_exception(*info))
    if storable(trace) == trace:
        log.log(level, "%s", text, exc_info=info)
    else:
        log.log(level, "%s\n%s", storable(text), storable(trace.rstrip()))
