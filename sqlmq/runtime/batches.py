"""Batch handlers: a handler that receives a list of up to ``batch`` messages at once.

::

    @broker.subscriber("rows", batch=500, batch_wait=0.2)
    async def load(rows: list[Row]) -> None:
        await insert_many(rows)

A batch is several ordinary deliveries handed to one call: each was acquired, is leased,
fenced and settled exactly as a single message is, so nothing new happens in the database
and every guarantee a delivery has (its channel's slot, its lease, its fencing token, its
redelivery after a crash) holds per message. What the batch adds is in the runtime:

* a worker takes one delivery, then whatever the buffer holds, waiting at most
  ``batch_wait`` seconds for more, up to ``batch`` in all;
* the handler's outcome applies to each message that was not settled by hand
  (``msg.ack()``, ``nack()``, ``reject()``, ``defer()`` on one item settle it alone): a
  return acknowledges them, an exception is a failure each message's retry strategy
  decides on;
* the results are written in one settle (the flusher never splits a batch), so a
  ``publish_to`` step's outputs, one message per item of the list it returned, are written
  in the transaction that archives the batch;
* with ``results=True`` the handler returns one result per message, a list in the order
  it received them, and each message's item is kept on its archive row by the statement
  that archives that message (see :func:`.carried.carried_batch`): fenced per message, so
  a stale delivery in the batch keeps nothing while the others keep theirs;
* the middleware's ``handle_batch`` hooks wrap the call (``handle`` wraps one message's
  call, and a batch has none; see :mod:`sqlmq.middleware`).

Messages that cannot run (expired, cancelled, past ``max_deliveries``, a body the
annotation refuses) are settled alone and left out of the list. A suspect (see
:mod:`.quarantine`) runs alone, as a batch of one.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

from ..errors import DecodeError, PayloadTooLarge, PipelineError, UnstorableResult
from ..lifecycle import (
    Ending,
    Outcome,
    Settlement,
    decide,
    exceeds_max_deliveries,
    unrunnable,
)
from ..message import Message
from ..middleware import MiddlewareError, wrapped_batch
from ..records import Delivery
from .carried import carried_batch
from .flusher import Flusher, _held_a_slot, _one_per_message
from .lease_deadlines import LeasesRanOut, within_leases
from .quarantine import is_suspect
from .workers import Workers, _log_failure

log = logging.getLogger("sqlmq")


class BatchFlusher(Flusher):
    """The flusher of a batch handler: it writes each batch's results in one settle, whose
    transaction is what makes a batch's outputs atomic with the batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The batches waiting, by the id() of their first result: how many results, from
        #: it on, must be written in the same settle.
        self._together: dict[int, int] = {}

    async def record_together(self, settlements: list[Settlement]) -> None:
        """Queue a batch's results, waiting while ``max_unflushed`` results wait already."""
        while len(self.results) >= self.cfg.max_unflushed:
            self._flushed.clear()
            await self._flushed.wait()
        if len(settlements) > 1:
            self._together[id(settlements[0])] = len(settlements)
        self.results.extend(settlements)
        held = self.holdings.held
        if (len(self.results) >= self.cfg.flush_batch or not self.cfg.flush_interval
                or any(_held_a_slot(held, s) for s in settlements)):
            self._now.set()

    def _pick(self) -> list[Settlement]:
        return _one_per_message(self.results, self.cfg.flush_batch, self._together)

    def _applied(self, batch: list[Settlement], applied: set[int], passed: int = 0) -> None:
        super()._applied(batch, applied, passed)
        for s in batch:
            self._together.pop(id(s), None)

    def _give_up(self, s: Settlement, exc: BaseException) -> None:
        super()._give_up(s, exc)
        self._together.pop(id(s), None)


class BatchWorkers(Workers):
    """The worker pool of a batch handler: each worker collects a batch, runs the handler
    once on it, and records the batch's results together."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if unwrapped := self._hooks.unwrapped_by_batches():
            # A handle hook wraps the call of one message: a batch has none to wrap.
            log.warning("%s is a batch handler: middleware %s wraps the handling of one "
                        "message (handle) and not of a batch (handle_batch), so it does not "
                        "see this subscriber's handling", self.name, ", ".join(unwrapped))

    async def _take(self, d: Delivery) -> None:
        batch = await self._collect(d)
        try:
            await self._take_batch(batch)
        except BaseException as exc:
            # The worker loop gives ``d`` back; the rest of the batch is given back here.
            if isinstance(exc, Exception) or not self.stopping:
                for other in batch[1:]:
                    self._abandon(other, exc)
            raise

    async def _collect(self, first: Delivery) -> list[Delivery]:
        """``first`` and the deliveries that follow it in the buffer, up to ``batch``,
        waiting at most ``batch_wait`` seconds for them. A stop's sentinel ends the batch
        and goes back for the worker loop to find."""
        cfg, buffer = self.cfg, self.buffer
        assert cfg.batch is not None and cfg.batch_wait is not None
        batch = [first]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.batch_wait
        while len(batch) < cfg.batch:
            if buffer.empty():
                left = deadline - loop.time()
                if left <= 0 or self.stopping:
                    break
                try:
                    async with asyncio.timeout(left):
                        d = await buffer.get()
                except TimeoutError:
                    break
            else:
                d = buffer.get_nowait()
            self._room()
            if d is None:
                buffer.put_nowait(None)
                break
            batch.append(d)
        return batch

    async def _take_batch(self, batch: list[Delivery]) -> None:
        holdings, gate = self._holdings, self._quarantine.gate
        ready: list[Delivery] = []
        for d in batch:
            key = (d.id, d.deliveries)
            if key in holdings.lost:  # the lease was lost before we started: not ours
                holdings.lost.discard(key)
                holdings.held.pop(key, None)
            elif not gate.is_set():  # a suspect runs alone: hand this one back
                self._flusher.add(decide(d, self.cfg, ending=Ending.UNSTARTED))
            else:
                ready.append(d)
        suspects = [d for d in ready
                    if is_suspect(d.history) and not exceeds_max_deliveries(d, self.cfg)]
        if suspects:
            # Perhaps a message that kills its process: each runs alone, the rest go back.
            for d in ready:
                if d not in suspects:
                    self._flusher.add(decide(d, self.cfg, ending=Ending.UNSTARTED))
            for d in suspects:
                await self._quarantine.run_alone(d, self._run_one, self.idle)
            return
        if ready:
            assert isinstance(self._flusher, BatchFlusher)
            await self._flusher.record_together(await self.run_batch(ready))

    async def _run_one(self, d: Delivery) -> Settlement | None:
        settlements = await self.run_batch([d])
        return settlements[0] if settlements else None

    async def run_batch(self, ds: list[Delivery]) -> list[Settlement]:
        """Handle ``ds`` to their settlements, counted as one handler running meanwhile."""
        self.running += 1
        self.idle.clear()
        try:
            settlements = await self._process_batch(ds)
            headers = {d.id: d.headers for d in ds}
            for s in settlements:
                self._announcer.mark(s, headers[s.id])
            return settlements
        finally:
            self.running -= 1
            if self.running == 0:
                self.idle.set()

    def _items(self, ds: list[Delivery], out: list[Settlement]
               ) -> tuple[list[Delivery], list[Message], list[Any]]:
        """The deliveries that run, their messages and the handler's list; the settlements
        of those that cannot run go to ``out``."""
        runs, msgs, items = [], [], []
        for d in ds:
            ending = unrunnable(d, self.cfg)
            if ending is not None:
                out.append(self._unrun(d, ending))
                continue
            msg = Message(d, self._leases)
            try:
                item = self.adapter.convert(msg)
            except DecodeError as exc:
                log.error("message %d of queue %s dead-lettered (archived FAILED) before its "
                          "batch handler ran: %s", d.id, d.queue, exc)
                out.append(decide(d, self.cfg, exc, ending=Ending.UNDECODABLE_BODY))
                continue
            runs.append(d)
            msgs.append(msg)
            items.append(item)
        return runs, msgs, items

    async def _process_batch(self, ds: list[Delivery]) -> list[Settlement]:
        cfg = self.cfg
        out: list[Settlement] = []
        runs, msgs, items = self._items(ds, out)
        if not runs:
            return out
        error: BaseException | None = None
        result = None
        hooks = self._hooks
        box: list[contextvars.Context] | None = (
            [] if hooks.publish and hooks.handle_batch and cfg.publish_to is not None else None)
        call = wrapped_batch(hooks, self.adapter.call_batch, msgs, items, box)
        try:
            if cfg.renew_leases:
                result = await within_leases(call, runs, self._holdings.deadlines)
            else:
                result = await call()
        except LeasesRanOut as ran:
            return out + self._ran_out(runs, msgs, ran.keys)
        except Exception as exc:
            error = exc
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            error = exc  # raised by the handler itself: a failure like any other
        settlements = self._settle_each(runs, msgs, error)
        if error is None and (cfg.results or cfg.publish_to is not None):
            context = box[-1] if box else None
            publish_output = None if not hooks.publish else (
                lambda outputs, msg: hooks.publish_output(outputs, msg, context))
            try:
                failed = carried_batch(runs, msgs, settlements, cfg, self.adapter.name, result,
                                       publish_output)
            except (UnstorableResult, PipelineError, MiddlewareError) as exc:
                error = exc
                settlements = self._settle_each(runs, msgs, error)
            else:
                for d, exc in failed:
                    self._report(d, exc, settlements[runs.index(d)])
        if error is not None:
            self._report_batch(runs, msgs, settlements, error)
        return out + settlements

    def _settle_each(self, runs: list[Delivery], msgs: list[Message],
                     error: BaseException | None) -> list[Settlement]:
        """Each message's settlement: its own decision if it made one, else the batch's."""
        settlements = []
        for d, msg in zip(runs, msgs, strict=True):
            s = decide(d, self.cfg, error, msg.decision)
            saved = s.saved_state
            if saved is not None and len(saved) > self.cfg.max_payload_bytes:
                s = decide(d, self.cfg, PayloadTooLarge(
                    f"the state message {d.id} saved with defer() is {len(saved)} bytes, over "
                    f"the limit of {self.cfg.max_payload_bytes} (max_payload_bytes)"))
            settlements.append(s)
        return settlements

    def _ran_out(self, runs: list[Delivery], msgs: list[Message],
                 keys: set[tuple[int, int]]) -> list[Settlement]:
        """The batch was cancelled when some leases ran out: those write nothing (they come
        back after their lease), the others are given back, or settled as decided."""
        out = []
        for d, msg in zip(runs, msgs, strict=True):
            if (d.id, d.deliveries) in keys:
                self._holdings.ran_out_while_running(d, self._flusher.counters,
                                                     self.adapter.name, self.cfg.lease)
            elif msg.decision is not None:
                s = decide(d, self.cfg, None, msg.decision)
                if self.cfg.results and s.outcome is Outcome.COMPLETE:
                    # acknowledged, with no list to take its result from: say why, for
                    # the caller's NoResult
                    s.error = (f"its batch was cut short before handler {self.adapter.name} "
                               f"returned (the lease of another message of it ran out)")
                out.append(s)
            else:
                out.append(decide(d, self.cfg, ending=Ending.CUT_SHORT))
        return out

    def _report_batch(self, runs: list[Delivery], msgs: list[Message],
                      settlements: list[Settlement], error: BaseException) -> None:
        """One log line for a failed batch (not one per message), with what follows."""
        followed = [s for s, m in zip(settlements, msgs, strict=True) if m.decision is None]
        outcomes: dict[str, int] = {}
        for s in followed:
            name = s.outcome.name.lower()
            outcomes[name] = outcomes.get(name, 0) + 1
        what = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())) or "none followed it"
        level = (logging.ERROR if any(s.outcome is Outcome.FAIL for s in followed)
                 else logging.WARNING)
        queues = ", ".join(sorted({d.queue for d in runs}))
        ids = [d.id for d in runs]  # in the batch's order, which need not be the ids'
        _log_failure(level, f"batch handler {self.adapter.name} failed on {len(runs)} "
                     f"messages of {queues} (ids {min(ids)} to {max(ids)}): "
                     f"{type(error).__name__}: {error}; the messages it did not settle by "
                     f"hand: {what}", error)
