"""The subscriber runtime: the loops that move messages between the database and handlers.

* fetch: acquires batches into a bounded prefetch buffer, polling adaptively and woken at
  once by in-process publishes (and NOTIFY on PostgreSQL);
* workers: run the handler and turn its result into a settlement;
* flush: writes settlements in batches, one engine call per batch, retried until it lands;
* lease keeper: extends the lease of every delivery still held, one statement per tick.

Quarantine: a message whose last two deliveries ended without a result (their leases
expired: the process died, or hung) is probably a poison message. It runs alone in its
process, with the prefetched messages handed back and no other handler running, so that if
it kills the process again, only its own delivery count goes up; messages that merely shared
a process with it are not pushed towards ``max_deliveries``. One expiry is not enough: after
a single crash every message the process held has one, and running them all alone would
stall the backlog (measured: ~60 msg/s while workers were being killed repeatedly).

Nothing here holds a transaction while a handler runs. Memory is bounded by ``prefetch``
plus ``max_unflushed``: when flushing keeps failing, workers wait and fetching stops.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from .backoff import Backoff, describe
from .engines.base import Engine
from .errors import DecodeError
from .message import Message
from .records import Delivery, Settlement, append_history, history_entry
from .retry import delay_seconds
from .states import AckPolicy, Outcome
from .subscriber import Subscriber
from .tasks import cancel_and_wait

log = logging.getLogger("sqlmq")

Key = tuple[int, int]  # (id, deliveries): one delivery


_YIELD_EVERY = 32  # messages a worker runs back to back before it lets the loop go round
#: How often a subscriber waiting for work reads the engine's commit counter (SQLite: 4 µs
#: a look, but each timer wake-up costs a VM 200-300 µs of CPU): every 5 ms while work came
#: recently, slowing to every 50 ms after a second or so without any.
COMMIT_WATCH_INTERVAL = 0.005
COMMIT_WATCH_IDLE = 0.05


@dataclass
class RuntimeCounters:
    acquired: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    released: int = 0
    stale: int = 0  # settlements dropped because the delivery was no longer ours
    lost_leases: int = 0
    unwritable: int = 0  # results the database refused although it answered (see _give_up)


def _error_text(exc: BaseException) -> str:
    """One line naming the error. ``str()`` of a user's exception may itself fail: that
    must not take the worker down with it."""
    try:
        message = str(exc)
    except Exception:
        message = "<str() of the exception failed>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return _storable(text[:2000])


#: How much of a handler's traceback the archive keeps (its last lines: where it failed).
TRACEBACK_LIMIT = 4096


def _failure_text(exc: BaseException) -> str:
    """What a failed handler leaves in the error column: the one line of :func:`_error_text`,
    then the traceback, bounded to its last ``TRACEBACK_LIMIT`` characters."""
    trace = "".join(traceback.format_exception(exc)).rstrip()
    if len(trace) > TRACEBACK_LIMIT:
        trace = "…" + trace[-TRACEBACK_LIMIT:]
    return f"{_error_text(exc)}\n\n{_storable(trace)}"


def _log_failure(level: int, text: str, error: BaseException) -> None:
    """Log ``text`` with ``error``'s traceback. A user's exception may carry text no log
    stream can encode (a lone surrogate): the record would then fail in every handler that
    writes it (and crash a test runner's worker). Such a traceback is logged escaped, as the
    archive stores it, instead of as ``exc_info``."""
    trace = "".join(traceback.format_exception(error))
    if _storable(trace) == trace:
        log.log(level, "%s", text, exc_info=error)
    else:
        log.log(level, "%s\n%s", _storable(text), _storable(trace.rstrip()))


def _storable(text: str) -> str:
    """Text every database accepts in a column and in JSON. A NUL or a lone surrogate in one
    handler's error would otherwise fail every flush of its batch, forever."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


class SubscriberRuntime:
    def __init__(self, engine: Engine, subscriber: Subscriber, wakeup: asyncio.Event) -> None:
        self.engine = engine
        self.subscriber = subscriber
        self.cfg = subscriber.config
        self.adapter = subscriber.adapter
        self.wakeup = wakeup
        self.counters = RuntimeCounters()
        self._buffer: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self._held: dict[Key, Delivery] = {}
        self._lost: set[Key] = set()
        #: Deliveries whose result was in a settle that failed: it may have committed all
        #: the same (the reply lost with the connection), see _settle.
        self._in_doubt: set[Key] = set()
        self._results: list[Settlement] = []
        self._space = asyncio.Event()
        self._flushed = asyncio.Event()
        self._flush_now = asyncio.Event()
        self._stopping = False
        self._fetch_task: asyncio.Task[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._flush_task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self._flush_backoff = Backoff(f"flush for {','.join(self.cfg.queues)}")
        self._flush_lock = asyncio.Lock()
        self._running = 0  # handlers in flight
        self._idle = asyncio.Event()
        self._idle.set()
        self._quarantine = asyncio.Lock()
        self._open = asyncio.Event()  # cleared while a suspect runs in quarantine
        self._open.set()
        self._caught_up = False  # the last acquire found fewer ready messages than it asked
        self._last_work = 0.0  # loop time of the last acquire that found work

    @property
    def name(self) -> str:
        return f"{self.adapter.name}@{','.join(self.cfg.queues)}"

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._fetch_task = self._loop_task(self._fetch_loop, f"sqlmq-fetch {self.name}")
        self._workers = [self._start_worker(i) for i in range(self.cfg.workers)]
        self._flush_task = self._loop_task(self._flush_loop, f"sqlmq-flush {self.name}")
        if self.cfg.renew_leases:
            self._lease_task = self._loop_task(self._lease_loop, f"sqlmq-lease {self.name}")

    def _loop_task(self, loop: Callable[[], Coroutine[Any, Any, None]],
                   name: str) -> asyncio.Task[None]:
        return asyncio.create_task(self._restarting(loop, name), name=name)

    async def _restarting(self, loop: Callable[[], Coroutine[Any, Any, None]],
                          name: str) -> None:
        """Run a background loop; an error it did not expect is logged with its traceback
        and the loop starts again a second later, instead of the task ending unseen."""
        while True:
            try:
                return await loop()
            except Exception as exc:
                if self._stopping:
                    raise
                log.error("%s failed: %s; restarting it in %.0f s", name, _error_text(exc),
                          LOOP_RESTART_DELAY, exc_info=exc)
            await asyncio.sleep(LOOP_RESTART_DELAY)

    @property
    def running(self) -> int:
        """Handlers in flight."""
        return self._running

    @property
    def buffered(self) -> int:
        """Fetched messages not started yet (a stop gives them back)."""
        return self._buffer.qsize()

    async def stop(self, graceful_timeout: float | None = None) -> None:
        """Stop fetching, give unstarted messages back, let running handlers finish within
        ``graceful_timeout``, then flush everything."""
        timeout = self.cfg.graceful_timeout if graceful_timeout is None else graceful_timeout
        self._stopping = True
        # Let an acquire in progress finish: cancelled mid-statement, it could commit on the
        # server and strand its messages until their lease expires.
        self.wakeup.set()
        self._space.set()
        self._open.set()
        if self._fetch_task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._fetch_task), timeout=max(timeout, 5))
            except TimeoutError:
                await cancel_and_wait(self._fetch_task)
        while not self._buffer.empty():
            d = self._buffer.get_nowait()
            if d is not None:
                self._results.append(_release_unstarted(d))
        for _ in self._workers:
            self._buffer.put_nowait(None)
        if self._workers:
            _, pending = await asyncio.wait(self._workers, timeout=timeout)
            if pending:
                log.warning("%d handler(s) of %s still running after %.1fs; cancelling them",
                            len(pending), self.name, timeout)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        # Whatever is still held without a result was cut short: give it back now rather
        # than leaving it to lease expiry.
        settled = {(s.id, s.deliveries) for s in self._results}
        for key, d in self._held.items():
            if key not in settled:
                self._results.append(
                    Settlement(d.id, d.deliveries, Outcome.RELEASE, error="cancelled on shutdown",
                               attempted=False)
                )
        async with self._flush_lock:  # never cancel a flush in the middle of its statement
            await cancel_and_wait(self._flush_task)
        deadline = asyncio.get_running_loop().time() + max(timeout, 5.0)
        while self._results and asyncio.get_running_loop().time() < deadline:
            await self._flush_once()
        if self._results:
            log.error("%s stopped with %d unflushed results; their leases will expire and the "
                      "messages will be delivered again", self.name, len(self._results))
        await cancel_and_wait(self._lease_task)

    # ---- fetch ---------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        cfg = self.cfg
        backoff = Backoff(f"fetch for {','.join(cfg.queues)}")
        idle = 0.0
        commits = self.engine.commit_counter()
        seen: int | None = None
        while not self._stopping:
            if not self._open.is_set():
                await self._open.wait()
                continue
            free = cfg.prefetch - self._buffer.qsize()
            if free <= 0 or len(self._results) >= cfg.max_unflushed:
                self._space.clear()
                await self._space.wait()
                continue
            limit = min(cfg.fetch_batch, free)
            if commits is not None:  # read before the acquire: a commit after it is news
                seen = commits()
            try:
                batch = await self.engine.acquire(cfg.queues, limit, cfg.lease)
            except Exception as exc:
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            for d in batch:
                self._held[(d.id, d.deliveries)] = d
                self._buffer.put_nowait(d)
            self.counters.acquired += len(batch)
            self._caught_up = len(batch) < limit
            if batch:
                self._last_work = asyncio.get_running_loop().time()
            if len(batch) >= limit:
                idle = 0.0
                wait = cfg.min_fetch_interval
            elif batch:
                idle = 0.0
                wait = max(cfg.min_fetch_interval, min(0.01, cfg.max_fetch_interval))
            else:  # nothing ready: back off towards max_fetch_interval
                idle = min(cfg.max_fetch_interval, max(idle * 2, 0.005))
                wait = idle
            if wait > 0:
                await self._wait_for_work(wait, commits, seen)
            else:
                await asyncio.sleep(0)
            if self.wakeup.is_set():
                # Work is on its way; it may not be visible yet (a wake-up from a caller's
                # commit can arrive just before the commit does): poll fast again.
                idle = 0.0
                self.wakeup.clear()

    async def _wait_for_work(self, wait: float, commits: Callable[[], int | None] | None,
                             seen: int | None) -> None:
        """Up to ``wait`` seconds, until a wake-up from this process or, where the engine
        has a commit counter (SQLite), until it moves: some connection committed, most
        likely another process's publish. Without it, work from another process waits for
        the poll, which backs off to ``max_fetch_interval`` while the queue is idle."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        step = wait if commits is None else min(
            COMMIT_WATCH_IDLE, max(COMMIT_WATCH_INTERVAL, (now - self._last_work) / 20))
        deadline = now + wait
        while (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self.wakeup.wait(), min(left, step))
                return
            except TimeoutError:
                pass
            if commits is not None and commits() != seen:
                return

    # ---- direct hand-over ----------------------------------------------------------------

    def takes_direct(self, queue: str) -> bool:
        """Whether a message published to ``queue`` in this process may come straight here,
        written already acquired, instead of waiting for the next acquire: only while this
        subscriber has nothing else to do (no ready backlog seen, nothing buffered, a worker
        free), so the message overtakes nothing it would otherwise have waited behind."""
        return (self._caught_up and not self._stopping and self._open.is_set()
                and queue in self.cfg.queues and self._buffer.empty()
                and self._running < self.cfg.workers
                and len(self._results) < self.cfg.max_unflushed)

    def hand_over(self, d: Delivery) -> bool:
        """Run a delivery acquired on this subscriber's behalf. False once stopping: the
        caller then gives it back."""
        if self._stopping:
            return False
        self._held[(d.id, d.deliveries)] = d
        self._buffer.put_nowait(d)
        self.counters.acquired += 1
        return True

    # ---- workers -------------------------------------------------------------------------

    async def _worker(self) -> None:
        streak = 0
        while True:
            if streak >= _YIELD_EVERY:
                # Handlers that never wait would keep the event loop to themselves while the
                # buffer lasts: yield now and then so that fetch and flush round trips, and
                # their replies, go on meanwhile.
                streak = 0
                await asyncio.sleep(0)
            streak += 1
            d = await self._buffer.get()
            self._space.set()
            if d is None:
                return
            try:
                await self._take(d)
            except Exception as exc:
                await self._worker_failed(d, exc)
            except BaseException:
                if not self._stopping:  # stop() gives back what it cut short itself
                    self._abandon(d, "its worker was cancelled")
                raise

    async def _take(self, d: Delivery) -> None:
        key = (d.id, d.deliveries)
        if key in self._lost:  # the lease was lost before we started: not ours to run
            self._lost.discard(key)
            self._held.pop(key, None)
            return
        if not self._open.is_set():  # a suspect runs alone: hand this one back
            self._results.append(_release_unstarted(d))
            return
        if _is_suspect(d) and not self._exceeds_max_deliveries(d):
            await self._run_quarantined(d)
            return
        await self._record(await self._run(d))

    async def _worker_failed(self, d: Delivery, exc: Exception) -> None:
        """A fault of sqlmq's own (or one no handler guard caught) while handling ``d``: log
        it with its traceback, give the delivery back and carry on with the next message,
        rather than let the worker task end unseen while its lease is renewed for ever."""
        log.error("worker of %s failed handling message %d (delivery %d): %s; giving the "
                  "message back and carrying on", self.name, d.id, d.deliveries,
                  _error_text(exc), exc_info=exc)
        self._abandon(d, f"sqlmq failed handling it: {_error_text(exc)}")

    def _abandon(self, d: Delivery, reason: str) -> None:
        """Give ``d`` back (PENDING, a delivery spent, after ``ABANDON_DELAY``) unless a result
        is already waiting or written. Its lease is no longer renewed once this is flushed;
        ``max_deliveries`` ends a message that fails this way every time."""
        key = (d.id, d.deliveries)
        if key not in self._held or any(
                (s.id, s.deliveries) == key for s in self._results):
            return
        self._results.append(Settlement(d.id, d.deliveries, Outcome.RELEASE, error=reason,
                                        delay=ABANDON_DELAY, attempted=False))
        self._flush_now.set()

    def _start_worker(self, i: int) -> asyncio.Task[None]:
        task = asyncio.create_task(self._worker(), name=f"sqlmq-worker-{i} {self.name}")
        task.add_done_callback(self._worker_ended)
        return task

    def _worker_ended(self, task: asyncio.Task[None]) -> None:
        """No worker ends unseen: one that ends other than through stop() (cancelled from
        outside, or an error the loop could not catch) is logged and replaced."""
        if self._stopping or task not in self._workers:
            return
        exc = None if task.cancelled() else task.exception()
        log.error("%s ended unexpectedly (%s); starting another in its place",
                  task.get_name(), "cancelled" if exc is None else _error_text(exc),
                  exc_info=exc)
        i = self._workers.index(task)
        self._workers[i] = self._start_worker(i)

    async def _record(self, settlement: Settlement) -> None:
        while len(self._results) >= self.cfg.max_unflushed:
            self._flushed.clear()
            await self._flushed.wait()
        self._results.append(settlement)
        if len(self._results) >= self.cfg.flush_batch:
            self._flush_now.set()

    async def _run(self, d: Delivery) -> Settlement:
        self._running += 1
        self._idle.clear()
        try:
            return await self._process(d)
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()

    async def _run_quarantined(self, d: Delivery) -> None:
        async with self._quarantine:
            self._open.clear()
            try:
                stop_markers = 0
                while not self._buffer.empty():
                    other = self._buffer.get_nowait()
                    if other is None:
                        stop_markers += 1
                    else:
                        self._results.append(_release_unstarted(other))
                for _ in range(stop_markers):
                    self._buffer.put_nowait(None)
                await self._idle.wait()
                # Hand-backs and finished results must be durable before the suspect runs,
                # or a crash now would charge those messages a delivery after all.
                await self._flush_all()
                self._results.append(await self._run(d))
                await self._flush_all()
            finally:
                self._open.set()
                self._space.set()

    def _exceeds_max_deliveries(self, d: Delivery) -> bool:
        limit = self.cfg.max_deliveries
        return limit is not None and d.deliveries > limit

    async def _process(self, d: Delivery) -> Settlement:
        cfg = self.cfg
        if d.defect is not None:
            return self._undecodable(d)
        if self._exceeds_max_deliveries(d):
            reason = f"max deliveries exceeded ({d.deliveries} > {cfg.max_deliveries})"
            log.error("message %d of queue %s dead-lettered (archived FAILED) without running "
                      "handler %s: %s; it ended %d deliveries without a result", d.id, d.queue,
                      self.adapter.name, reason, d.deliveries - 1 - d.attempts)
            return self._fail(d, reason, "max_deliveries", attempted=False)
        msg = Message(d, self)
        error: BaseException | None = None
        try:
            await self.adapter(msg)
        except DecodeError as exc:
            if msg.decision is None:
                log.error("message %d of queue %s dead-lettered (archived FAILED) before its "
                          "handler ran: %s", d.id, d.queue, exc)
                return self._fail(d, f"decode error: {exc}", "decode_error", attempted=False)
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
        settlement = self._settlement(d, msg, error)
        if error is not None:
            self._report(d, error, settlement)
        return settlement

    def _settlement(self, d: Delivery, msg: Message, error: BaseException | None) -> Settlement:
        cfg = self.cfg
        decision = msg.decision
        if decision is not None:
            if decision.kind == "ack":
                return self._complete(d, error)
            if decision.kind == "reject":
                reason = _storable(decision.reason or (_failure_text(error) if error
                                                       else "rejected"))
                return self._fail(d, reason, "rejected")
            return self._nack(d, error, decision.delay)
        if error is None:
            if cfg.ack_policy is AckPolicy.MANUAL:
                log.warning("handler %s returned without settling message %d under the MANUAL "
                            "ack policy; treating it as a nack", self.adapter.name, d.id)
                return self._nack(d, None, None, "returned without ack/nack/reject (MANUAL)")
            return self._complete(d, None)
        if cfg.ack_policy is AckPolicy.ACK:
            return self._complete(d, error)
        if cfg.ack_policy is AckPolicy.REJECT_ON_ERROR:
            return self._fail(d, _failure_text(error), "error")
        return self._nack(d, error, None)

    def _report(self, d: Delivery, error: BaseException, s: Settlement) -> None:
        """One log line per failed handler run, with its traceback: what failed, which
        attempt, and what happens next. WARNING while a retry is left, ERROR when the
        message is dead-lettered (archived FAILED)."""
        where = (f"handler {self.adapter.name} failed on message {d.id} of queue {d.queue} "
                 f"(attempt {d.attempts + 1}, delivery {d.deliveries}): {_error_text(error)}")
        if s.outcome is Outcome.RETRY:
            _log_failure(logging.WARNING, f"{where}; retrying in {s.delay:.3g}s", error)
        elif s.outcome is Outcome.FAIL:
            first_line = (s.error or "").split("\n", 1)[0]
            _log_failure(logging.ERROR, f"{where}; dead-lettered (archived FAILED): "
                         f"{first_line}", error)
        elif s.outcome is Outcome.COMPLETE:
            _log_failure(logging.WARNING,
                         f"{where}; archived COMPLETED all the same (acknowledged)", error)
        else:
            _log_failure(logging.WARNING, f"{where}; released", error)

    def _undecodable(self, d: Delivery) -> Settlement:
        """Archive a row the engine could not decode FAILED, without running the handler.
        Its history stays as stored (it may be the column at fault): nothing is rewritten."""
        reason = _storable(d.defect or "undecodable row")
        log.error("message %d of queue %s (delivery %d), %s; archiving it FAILED", d.id,
                  d.queue, d.deliveries, reason)
        return Settlement(d.id, d.deliveries, Outcome.FAIL, error=reason, attempted=False)

    def _complete(self, d: Delivery, error: BaseException | None) -> Settlement:
        return Settlement(d.id, d.deliveries, Outcome.COMPLETE,
                          error=_failure_text(error) if error else None)

    def _fail(self, d: Delivery, reason: str, ended: str, attempted: bool = True) -> Settlement:
        history = append_history(d.history, history_entry(d.deliveries, ended, error=reason))
        return Settlement(d.id, d.deliveries, Outcome.FAIL, error=reason, attempted=attempted,
                          history=history)

    def _nack(self, d: Delivery, error: BaseException | None, delay: float | None,
              reason: str | None = None) -> Settlement:
        reason = reason or (_failure_text(error) if error else "nacked")
        attempt = d.attempts + 1
        try:
            allowed = delay_seconds(self.cfg.retry, attempt, error)
        except Exception as exc:
            return self._fail(d, f"retry strategy failed ({_error_text(exc)}); last error: "
                                 f"{reason}", "error")
        if allowed is None:
            return self._fail(d, f"retries exhausted after {attempt} attempt(s): {reason}",
                              "error" if error else "nacked")
        history = append_history(
            d.history, history_entry(d.deliveries, "error" if error else "nacked", error=reason)
        )
        return Settlement(d.id, d.deliveries, Outcome.RETRY, error=reason,
                          delay=allowed if delay is None else delay, history=history)

    # ---- flush ---------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._flush_now.wait(), self.cfg.flush_interval)
            except TimeoutError:
                pass
            self._flush_now.clear()
            await self._flush_once()

    async def _flush_all(self) -> None:
        while self._results and not self._stopping:
            await self._flush_once()

    async def _flush_once(self) -> None:
        async with self._flush_lock:
            await self._flush_locked()

    async def _flush_locked(self) -> None:
        while self._results:
            batch = _one_per_message(self._results, self.cfg.flush_batch)
            try:
                applied = await self._settle(batch)
            except Exception as exc:
                if (self._flush_backoff.failures + 1 >= ISOLATE_AFTER
                        and await self._database_answers()):
                    # The database is up, yet this batch keeps failing: one result in it
                    # cannot be written. Find it rather than stop the worker for good.
                    if await self._settle_apart(batch):
                        self._flush_backoff.succeeded()
                        continue
                await self._flush_backoff.failed(exc)
                return
            self._flush_backoff.succeeded()
            self._applied(batch, applied)

    async def _settle(self, batch: list[Settlement]) -> set[int]:
        """Settle ``batch``; the ids whose result is written, now or by an earlier try.

        A settle that fails may still have committed: the server ran the COMMIT and the
        connection died before its reply arrived (a restart, a killed connection). Retried,
        those rows are no longer PROCESSING and the engine leaves them out, exactly as if a
        newer delivery had taken them; counted stale, the messages would be archived but
        never counted completed. So every result of a failed batch is in doubt until a
        settle succeeds, and the ones it leaves out are then looked up (``landed``)."""
        try:
            applied = await self.engine.settle(batch)
            doubtful = [s for s in batch
                        if s.id not in applied and (s.id, s.deliveries) in self._in_doubt]
            if doubtful:
                applied = applied | await self.engine.landed(doubtful)
        except BaseException:
            self._in_doubt.update((s.id, s.deliveries) for s in batch)
            raise
        return applied

    def _applied(self, batch: list[Settlement], applied: set[int]) -> None:
        k = len(batch)
        if len(self._results) >= k and all(map(operator.is_, batch, self._results)):
            del self._results[:k]  # the usual case: the batch was the oldest results
        else:
            flushed = {id(s) for s in batch}
            self._results[:] = [s for s in self._results if id(s) not in flushed]
        c = self.counters
        for s in batch:
            self._held.pop((s.id, s.deliveries), None)
            self._lost.discard((s.id, s.deliveries))
            self._in_doubt.discard((s.id, s.deliveries))
            if s.id not in applied:
                c.stale += 1
                log.warning("dropped a stale result for message %d (delivery %d): its lease "
                            "expired and it was delivered again", s.id, s.deliveries)
            elif s.outcome is Outcome.COMPLETE:
                c.completed += 1
            elif s.outcome is Outcome.FAIL:
                c.failed += 1
            elif s.outcome is Outcome.RETRY:
                c.retried += 1
            else:
                c.released += 1
        self._flushed.set()
        self._space.set()

    async def _database_answers(self) -> bool:
        try:
            await self.engine.now()
        except Exception:
            return False
        return True

    async def _settle_apart(self, batch: list[Settlement]) -> bool:
        """Find the one result the database refuses: settle the halves and follow the half
        that fails. When both halves fail, the database is refusing everything (a missing
        table, a permission) rather than one result: nothing is given up then, and the flush
        backs off as usual. True when some results were written (or one given up)."""
        progress = False
        while len(batch) > 1:
            mid = len(batch) // 2
            failed = []
            for half in (batch[:mid], batch[mid:]):
                try:
                    applied = await self._settle(half)
                except Exception:
                    failed.append(half)
                else:
                    self._applied(half, applied)
                    progress = True
            if len(failed) != 1:
                return progress
            batch = failed[0]
        if not progress:  # a lone result: nothing shows it is the one at fault
            return False
        try:  # it failed beside one that did not; a lock timeout deserves a second try
            applied = await self._settle(batch)
        except Exception as exc:
            if await self._database_answers():
                self._give_up(batch[0], exc)
        else:
            self._applied(batch, applied)
        return True

    def _give_up(self, s: Settlement, exc: BaseException) -> None:
        """Drop a result the database will not take. The message itself stays in the queue,
        PROCESSING under a lease we stop renewing, so it is delivered again once the lease
        expires: nothing is lost, and the worker goes on with everything else."""
        self._results[:] = [r for r in self._results if r is not s]
        self._held.pop((s.id, s.deliveries), None)
        self._in_doubt.discard((s.id, s.deliveries))
        self.counters.unwritable += 1
        log.error("the result of message %d (delivery %d, %s) cannot be written: %s; it will be "
                  "delivered again when its lease expires", s.id, s.deliveries,
                  s.outcome.name.lower(), describe(exc))
        self._flushed.set()
        self._space.set()

    # ---- leases --------------------------------------------------------------------------

    async def _lease_loop(self) -> None:
        backoff = Backoff(f"lease renewal for {','.join(self.cfg.queues)}")
        while True:
            await asyncio.sleep(self.cfg.lease / 3)
            try:
                await self._renew()
            except Exception as exc:
                await backoff.failed(exc)
            else:
                backoff.succeeded()

    async def _renew(self) -> None:
        keys = list(self._held)
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            kept = await self.engine.extend(chunk, self.cfg.lease)
            # A delivery whose result is already being flushed may have been archived in the
            # meantime: missing from ``kept`` then means settled, not lost.
            finished = {(s.id, s.deliveries) for s in self._results}
            for key in chunk:
                if key[0] not in kept and key in self._held and key not in finished:
                    self._lost.add(key)
                    self.counters.lost_leases += 1
                    log.warning("lease of message %d (delivery %d) was lost before it could be "
                                "renewed", key[0], key[1])

    async def extend_one(self, d: Delivery, seconds: float) -> bool:
        try:
            kept = await self.engine.extend([(d.id, d.deliveries)], seconds)
        except Exception as exc:
            log.warning("extending the lease of message %d failed: %s", d.id, describe(exc))
            raise
        return d.id in kept


#: Consecutive failed flushes, with the database answering, after which the batch is split
#: to find a result it refuses.
ISOLATE_AFTER = 3

#: Seconds before a background loop that failed unexpectedly starts again.
LOOP_RESTART_DELAY = 1.0

#: Seconds before a delivery given back after a fault of the runtime may run again: a fault
#: that repeats then costs a delivery a second rather than spinning.
ABANDON_DELAY = 1.0

#: Consecutive lease expiries after which a message runs in quarantine.
QUARANTINE_AFTER = 2


def _is_suspect(d: Delivery) -> bool:
    """The last deliveries all ended without a result: the process died or the lease ran out."""
    tail = d.history[-QUARANTINE_AFTER:]
    return len(tail) == QUARANTINE_AFTER and all(e.get("ended") == "lease_expired" for e in tail)


def _one_per_message(results: list[Settlement], limit: int) -> list[Settlement]:
    """Up to ``limit`` results, at most one per message: the engine reports the ids that
    landed, so a stale result beside a newer one of the same message would be miscounted."""
    batch: list[Settlement] = []
    ids: set[int] = set()
    for s in results:
        if s.id not in ids:
            batch.append(s)
            ids.add(s.id)
            if len(batch) == limit:
                break
    return batch


def _release_unstarted(d: Delivery) -> Settlement:
    return Settlement(d.id, d.deliveries, Outcome.RELEASE, refund=True, attempted=False)
