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
from collections.abc import Callable
from dataclasses import dataclass

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
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return _storable(text[:2000])


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
        self._fetch_task = asyncio.create_task(
            self._fetch_loop(), name=f"sqlmq-fetch {self.name}"
        )
        self._workers = [
            asyncio.create_task(self._worker(), name=f"sqlmq-worker-{i} {self.name}")
            for i in range(self.cfg.workers)
        ]
        self._flush_task = asyncio.create_task(
            self._flush_loop(), name=f"sqlmq-flush {self.name}"
        )
        if self.cfg.renew_leases:
            self._lease_task = asyncio.create_task(
                self._lease_loop(), name=f"sqlmq-lease {self.name}"
            )

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
            key = (d.id, d.deliveries)
            if key in self._lost:  # the lease was lost before we started: not ours to run
                self._lost.discard(key)
                self._held.pop(key, None)
                continue
            if not self._open.is_set():  # a suspect runs alone: hand this one back
                self._results.append(_release_unstarted(d))
                continue
            if _is_suspect(d) and not self._exceeds_max_deliveries(d):
                await self._run_quarantined(d)
                continue
            await self._record(await self._run(d))

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
        if self._exceeds_max_deliveries(d):
            reason = f"max deliveries exceeded ({d.deliveries} > {cfg.max_deliveries})"
            return self._fail(d, reason, "max_deliveries", attempted=False)
        msg = Message(d, self)
        error: BaseException | None = None
        try:
            await self.adapter(msg)
        except DecodeError as exc:
            if msg.decision is None:
                return self._fail(d, f"decode error: {exc}", "decode_error", attempted=False)
            error = exc
        except Exception as exc:
            error = exc
        decision = msg.decision
        if decision is not None:
            if decision.kind == "ack":
                return self._complete(d, error)
            if decision.kind == "reject":
                reason = _storable(decision.reason or (_error_text(error) if error else "rejected"))
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
            return self._fail(d, _error_text(error), "error")
        return self._nack(d, error, None)

    def _complete(self, d: Delivery, error: BaseException | None) -> Settlement:
        return Settlement(d.id, d.deliveries, Outcome.COMPLETE,
                          error=_error_text(error) if error else None)

    def _fail(self, d: Delivery, reason: str, ended: str, attempted: bool = True) -> Settlement:
        history = append_history(d.history, history_entry(d.deliveries, ended, error=reason))
        return Settlement(d.id, d.deliveries, Outcome.FAIL, error=reason, attempted=attempted,
                          history=history)

    def _nack(self, d: Delivery, error: BaseException | None, delay: float | None,
              reason: str | None = None) -> Settlement:
        reason = reason or (_error_text(error) if error else "nacked")
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
                applied = await self.engine.settle(batch)
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
                    applied = await self.engine.settle(half)
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
            applied = await self.engine.settle(batch)
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
