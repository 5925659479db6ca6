"""Workflows in the in-memory engine, as :mod:`sqlmq.engines.sql.workflows` writes them:
a waiting step is a row in state WAITING with no due time and no channel, released or
cancelled by the settle (or cancel) that ends its dependencies, under the store's lock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from ...commit_hooks import on_commit
from ...errors import PublishError
from ...lifecycle import Outcome, Settlement, State, history_entry
from ...workflows.graph import Waiter, next_level, revived_counts
from ...workflows.records import Dependency, Signal, StepSpec, StepStatus, WorkflowSummary
from .transactions import begin_callers, transaction_owner

#: The in-memory engine's store (:class:`.engine.MemoryStore`, which imports this module)
#: and its rows.
MemoryStore = Any
Row = Any

_RELEASED, _CANCELLED, _WAITING = "RELEASED", State.CANCELLED.value, State.WAITING.value
_CASCADED = "CASCADED"  # cancelled by a failed dependency (see ..sql.workflows)


@dataclass(slots=True)
class StepRow:
    """A row of the step table."""

    id: int
    workflow: str
    name: str
    queue: str
    channel: str | None
    delay: float
    at: datetime | None
    waiting: int
    on_failure: str
    status: str
    created_at: datetime


@dataclass
class MemoryWorkflows:
    """The step table and its edges, both ways."""

    #: Signals kept for messages: (message, name) -> (payload, sent_at, read_by).
    signals: dict[tuple[int, str], tuple[bytes | None, datetime, int | None]] = field(
        default_factory=dict)
    steps: dict[int, StepRow] = field(default_factory=dict)
    by_workflow: dict[str, list[int]] = field(default_factory=dict)
    #: The names of workflows published in a caller's transaction not yet committed: a
    #: second publish of one is refused, as the SQL engines' unique index refuses it once
    #: the first commits (they make it wait until then; this engine cannot).
    reserved: set[str] = field(default_factory=set)
    dependents: dict[int, list[int]] = field(default_factory=dict)
    needs: dict[int, list[int]] = field(default_factory=dict)

    def made(self, workflow: str, specs: Sequence[StepSpec], store: MemoryStore,
             now: datetime) -> tuple[list[Row], list[int], Callable[[], None]]:
        """The rows of ``specs`` (not yet visible), their ids, and what records the steps
        once they are."""
        if workflow in self.by_workflow or workflow in self.reserved:
            raise PublishError(f"workflow {workflow!r} exists already: a workflow's name "
                               f"names one publish")
        rows: list[Row] = []
        ids: list[int] = []
        for spec in specs:
            if spec.after:
                (row,), _ = store.new_rows(replace(spec.message, channel=None), now)
                row.state, row.next_attempt_at = State.WAITING, None
            else:
                (row,), _ = store.new_rows(spec.message, now)
            rows.append(row)
            ids.append(row.id)

        def record() -> None:
            self.by_workflow[workflow] = list(ids)
            for msg_id, spec in zip(ids, specs, strict=True):
                m = spec.message
                self.steps[msg_id] = StepRow(
                    msg_id, workflow, spec.name, m.queue, m.channel, m.delay, m.at,
                    len(spec.after), spec.on_failure.value,
                    _WAITING if spec.after else _RELEASED, now)
                for j in spec.after:
                    self.needs.setdefault(msg_id, []).append(ids[j])
                    self.dependents.setdefault(ids[j], []).append(msg_id)

        return rows, ids, record

    def ended(self, store: MemoryStore, ended: dict[int, str], now: datetime) -> None:
        """As :meth:`..sql.workflows.steps.StepStatements._steps_ended`."""
        while ended:
            edges = [(step, d) for d in ended for step in self.dependents.get(d, ())]
            waiters = [Waiter(s.id, s.waiting, s.on_failure)
                       for s in (self.steps[i] for i in {e[0] for e in edges})
                       if s.status == _WAITING]
            if not waiters:
                return
            names = {i: self.steps[i].name for i in ended if i in self.steps}
            level = next_level(waiters, edges, ended, names)
            for i, w in level.waiting.items():
                self.steps[i].waiting = w
            for i in level.released:
                self._release(store, self.steps[i], now)
            for i, reason in level.cancelled.items():
                self.steps[i].status = _CASCADED
                row = store.rows.get(i)
                if row is not None:
                    store._archive(row, Settlement(
                        i, 0, Outcome.CANCEL, error=reason, attempted=False,
                        history=[history_entry(0, "cancelled", error=reason)]), now)
            ended = dict.fromkeys(level.cancelled, _CANCELLED)

    def _release(self, store: MemoryStore, step: StepRow, now: datetime) -> None:
        step.status = _RELEASED
        row = store.rows.get(step.id)
        if row is None or row.state != State.WAITING:
            return
        row.state = State.PENDING
        due = now + timedelta(seconds=step.delay) if step.at is None else step.at.astimezone(UTC)
        if step.channel is not None:
            turns = store.channels.admit(step.channel, step.queue, 1, store.rows.values(), now,
                                         refuse=False)
            row.channel = step.channel
            row.fair_key = None if turns is None else turns.key(row.priority)
        row.wait_until(due)

    def requeued(self, store: MemoryStore, ids: Sequence[int],
                 waiting_row: Callable[[Any], Row]) -> None:
        """As :meth:`..sql.workflows.steps.StepStatements._steps_requeued` (``waiting_row``:
        an archived step's row back in the table, waiting)."""
        frontier = [i for i in ids if i in self.steps]
        for i in frontier:
            self.steps[i].status = _RELEASED
        while frontier:
            cancelled = {d: self.steps[d].on_failure for f in frontier
                         for d in self.dependents.get(f, ()) if self.steps[d].status == _CASCADED}
            needs = {c: self.needs.get(c, []) for c in cancelled}
            ended = {d: store.archive[d].state for ds in needs.values() for d in ds
                     if d in store.archive}
            counts = revived_counts(cancelled, needs, ended)
            for i, left in counts.items():
                a = store.archive.pop(i)
                store.add([waiting_row(a)])
                self.steps[i].status, self.steps[i].waiting = _WAITING, left
            frontier = sorted(counts)

    def cancelled(self, store: MemoryStore, msg_id: int, now: datetime) -> None:
        """Message ``msg_id``, just archived CANCELLED by a cancel, ends as a step."""
        step = self.steps.get(msg_id)
        if step is not None and step.status == _WAITING:
            step.status = _CANCELLED
        self.ended(store, {msg_id: _CANCELLED}, now)

    def status(self, store: MemoryStore, workflow: str) -> list[StepStatus]:
        out = []
        for i in self.by_workflow.get(workflow, []):
            s = self.steps[i]
            row, done = store.rows.get(i), store.archive.get(i)
            state = done.state if done else (str(row.state) if row else "UNKNOWN")
            found: Any = done or row
            out.append(StepStatus(
                s.name, i, s.queue, state,
                sorted(self.steps[d].name for d in self.needs.get(i, [])),
                found.attempts_count if found else 0,
                done.error if done else (row.last_error if row else None),
                s.on_failure, done.result if done else None))
        return out

    def summaries(self, store: MemoryStore, limit: int) -> list[WorkflowSummary]:
        out = []
        for name, ids in self.by_workflow.items():
            done = [store.archive[i] for i in ids if i in store.archive]
            out.append(WorkflowSummary(
                name, len(ids), len(done), sum(a.state == State.COMPLETED for a in done),
                self.steps[ids[0]].created_at))
        out.sort(key=lambda w: (w.created_at, w.name), reverse=True)
        return out[:limit]

    def dependencies(self, store: MemoryStore, msg_id: int) -> list[Dependency]:
        out = []
        for d in sorted(self.needs.get(msg_id, [])):
            a = store.archive.get(d)
            out.append(Dependency(self.steps[d].name, d, a.state if a else "UNKNOWN",
                                  a.error if a else None, a.result if a else None))
        return out


class MemoryWorkflowCalls:
    """The workflows half of the engine contract for :class:`~.engine.MemoryEngine`, and
    what its settle and cancel call."""

    _lock: threading.Lock
    _store: MemoryStore
    _workflows: MemoryWorkflows
    _writes: int
    _now: Callable[[], datetime]
    _rolled_back: Callable[[list[Row]], None]

    async def publish_workflow(self, workflow: str, steps: Sequence[StepSpec],
                               executor: Any = None) -> list[int]:
        await begin_callers(executor)
        return self.publish_workflow_sync(workflow, steps, executor)

    def publish_workflow_sync(self, workflow: str, steps: Sequence[StepSpec],
                              executor: Any = None) -> list[int]:
        """As ``publish_sync``: with ``executor``, the steps appear at its commit."""
        target = None if executor is None else transaction_owner(executor)
        with self._lock:
            rows, ids, record = self._workflows.made(workflow, steps, self._store, self._now())
            if target is None:
                self._store.add(rows)
                record()
                self._writes += 1
            else:
                self._workflows.reserved.add(workflow)

        def commit() -> None:
            with self._lock:
                self._workflows.reserved.discard(workflow)
                self._store.add(rows)
                record()
                self._writes += 1

        def rollback() -> None:
            with self._lock:
                self._workflows.reserved.discard(workflow)
            self._rolled_back(rows)

        if target is not None:
            on_commit(target, object(), commit, rollback)
        return ids

    async def workflow_steps(self, workflow: str) -> list[StepStatus]:
        with self._lock:
            return self._workflows.status(self._store, workflow)

    async def workflows(self, limit: int) -> list[WorkflowSummary]:
        with self._lock:
            return self._workflows.summaries(self._store, limit)

    async def dependencies(self, msg_id: int) -> list[Dependency]:
        with self._lock:
            return self._workflows.dependencies(self._store, msg_id)

    async def signal(self, msg_id: int, name: str, payload: bytes | None) -> bool:
        """As :meth:`..sql.workflows.signals.SignalStatements.signal`, under the lock."""
        with self._lock:
            row = self._store.rows.get(msg_id)
            if row is None:
                return False
            now = self._now()
            self._workflows.signals[msg_id, name] = (payload, now, None)
            if row.waits_for == name and row.state in (State.PENDING, State.RETRYABLE):
                row.wait_until(now)
            self._writes += 1
            return True

    async def received_signal(self, msg_id: int, deliveries: int) -> Signal | None:
        with self._lock:
            row = self._store.rows.get(msg_id)
            waits = None if row is None else row.waits_for
            if waits is None:
                return None
            found = self._workflows.signals.get((msg_id, waits))
            if found is None:
                return Signal(waits)
            self._workflows.signals[msg_id, waits] = (found[0], found[1], deliveries)
            return Signal(waits, found[0], found[1])

    async def forget_ended_signals(self, before: datetime, limit: int) -> int:
        with self._lock:
            signals, rows = self._workflows.signals, self._store.rows
            ended = sorted({msg_id for (msg_id, _), (_, sent, _) in signals.items()
                            if sent < before and msg_id not in rows})[:limit]
            gone = set(ended)
            for key in [k for k, v in signals.items() if k[0] in gone and v[1] < before]:
                del signals[key]
            return len(ended)

    def _signals_waited(self, settlements: Sequence[Settlement]) -> Sequence[Settlement]:
        """``settlements``, a defer that waits for a signal that came already due now (and
        the signals a delivery read forgotten), as the SQL engines' defer writes it."""
        if not any(s.waits_for is not None for s in settlements):
            return settlements
        signals = self._workflows.signals
        out = []
        for s in settlements:
            if s.outcome is Outcome.DEFER and s.waits_for is not None \
                    and self._store.held(s.id, s.deliveries) is not None:
                for key in [k for k, v in signals.items() if k[0] == s.id and v[2] is not None]:
                    del signals[key]
                if (s.id, s.waits_for) in signals:
                    s = replace(s, delay=0.0, at=None)
            out.append(s)
        return out

    def _steps_settled(self, settlements: Sequence[Settlement], applied: set[int],
                       now: datetime) -> None:
        """The steps among ``settlements`` that ``applied`` ended release or cancel what
        waits on them (under the lock, in the settle)."""
        archive = self._store.archive
        ended = {s.id: archive[s.id].state for s in settlements
                 if s.step and s.id in applied and s.id in archive}
        if ended:
            self._workflows.ended(self._store, ended, now)


__all__ = ["MemoryWorkflowCalls", "MemoryWorkflows", "StepRow"]
