"""A workflow's publish on the SQL engines, in SQLAlchemy Core (schema version 23; see
:mod:`sqlmq.workflows`): its steps' message rows, the step rows and their edges, in one
transaction.

A step that waits is a message row in state WAITING with no due time and no channel, so no
acquire reads it (:mod:`.steps` releases it). The publish is a flow of statements
(:mod:`..publish`), so that it runs in any transaction a publish runs in: sqlmq's own, a
SQLAlchemy connection's or session's, a driver's connection, synchronous or not.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, literal, select, update
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Executable

from ....errors import PublishError
from ....lifecycle import State
from ....new_messages import joined
from ....records import NewMessages
from ....schema import Schema
from ....sqltime import db_now_plus
from ....workflows.records import StepSpec
from ..lists import listed
from ..publish import Flow, publish_flow
from .released import due_after_delays, released_one

#: The due time a waiting step's row is inserted with, taken off at once (a publish's
#: insert needs one; no acquire reads a row without it).
_PARKED_AT = datetime(9999, 1, 1, tzinfo=UTC)
_NOW = db_now_plus(literal(0.0))
_RELEASED, _WAITING = "RELEASED", State.WAITING.value


class StepPublish:
    """``publish_workflow`` for :class:`~..engine.SqlEngine`."""

    schema: Schema
    _run_core: Callable[..., Awaitable[Any]]
    _run_core_sync: Callable[..., Any]
    _publish_flow: Callable[[NewMessages], Callable[[Dialect], Flow]]
    _queue_wake_statement: Callable[[str], Executable | None]

    async def publish_workflow(self, workflow: str, steps: Sequence[StepSpec],
                               executor: Any = None) -> list[int]:
        return await self._run_core(  # type: ignore[no-any-return]
            lambda dialect: self._workflow_flow(workflow, steps, dialect),
            steps[0].message, executor)

    def publish_workflow_sync(self, workflow: str, steps: Sequence[StepSpec],
                              executor: Any = None) -> list[int]:
        return self._run_core_sync(  # type: ignore[no-any-return]
            lambda dialect: self._workflow_flow(workflow, steps, dialect),
            steps[0].message, executor)

    def _workflow_flow(self, workflow: str, steps: Sequence[StepSpec],
                       dialect: Dialect) -> Flow:
        s, n = self.schema.step, self.schema.step_need
        taken = (yield select(s.c.id).where(s.c.workflow == workflow).limit(1), None).first()
        # the database's clock read once, a parameter of every row: with a function in its
        # VALUES, the MariaDB driver sent the step rows one INSERT each (4 s for 10,000)
        now = (yield select(_NOW.label("now")), None).scalar_one()
        if taken is not None:
            raise PublishError(f"workflow {workflow!r} exists already: a workflow's name "
                               f"names one publish")
        if any(spec.message.dedup_keys is not None
               or (spec.message.channel is not None and not spec.after) for spec in steps):
            ids = yield from self._one_by_one(steps, dialect)
        else:
            ids = yield from self._all_at_once(steps, dialect)
        rows = [{"id": ids[i], "workflow": workflow, "name": spec.name,
                 "queue": spec.message.queue, "channel": spec.message.channel,
                 "delay_seconds": spec.message.delay, "due_at": spec.message.at,
                 "waiting": len(spec.after), "on_failure": spec.on_failure.value,
                 "status": _WAITING if spec.after else _RELEASED, "created_at": now}
                for i, spec in enumerate(steps)]
        yield s.insert(), rows
        edges = [{"step": ids[i], "needs": ids[j]}
                 for i, spec in enumerate(steps) for j in spec.after]
        if edges:
            yield n.insert(), edges
        return ids

    def _one_by_one(self, steps: Sequence[StepSpec], dialect: Dialect) -> Flow:
        """The steps' messages, each published as a publish writes it (a channel's turn
        taken, its size checked, its deduplication key looked up), or inserted waiting."""
        m = self.schema.message
        ids: list[int] = []
        for spec in steps:
            if not spec.after:
                (msg_id,) = yield from self._publish_flow(spec.message)(dialect)
            else:
                parked = replace(spec.message, delay=0.0, at=_PARKED_AT, channel=None)
                (msg_id,) = yield from publish_flow(m, dialect, parked, None)
                yield _parked(m, dialect), {"p_ids": [msg_id]}
            ids.append(int(msg_id))
        return ids

    def _all_at_once(self, steps: Sequence[StepSpec], dialect: Dialect) -> Flow:
        """The steps' messages inserted waiting, a multi-row insert per run of steps that
        share a queue, a priority and an expiry (so their ids follow the order the steps
        were added in), then the steps that wait on nothing made what a publish writes,
        as a release makes a step: a few statements whatever the number of steps."""
        m = self.schema.message
        ids: list[int] = []
        for batch in _runs([replace(spec.message, delay=0.0, at=_PARKED_AT, channel=None)
                            for spec in steps]):
            ids += map(int, (yield from publish_flow(m, dialect, batch, None)))
        yield _parked(m, dialect), {"p_ids": ids}
        first = [(ids[i], spec.message) for i, spec in enumerate(steps) if not spec.after]
        # not ``yield from``: a flow is sent each statement's result, which a list takes not
        for step in due_after_delays(m, dialect, [(msg_id, message.delay)  # noqa: UP028
                                                   for msg_id, message in first
                                                   if message.at is None]):
            yield step
        at = [{"p_id": msg_id, "p_channel": None, "p_key": None, "p_ordered": 0,
               "p_at": message.at} for msg_id, message in first if message.at is not None]
        if at:
            yield released_one(m, True), at
        for queue in sorted({message.queue for _, message in first}):
            wake = self._queue_wake_statement(queue)
            if wake is not None:
                yield wake, None
        return ids


@functools.lru_cache(maxsize=16)
def _parked(m: Table, dialect: Dialect) -> Any:
    """Messages ``p_ids``, just inserted, made steps that wait: no due time, so no acquire
    reads them."""
    return update(m).where(listed(dialect, m.c.id, "p_ids", "id")).values(
        state=_WAITING, next_attempt_at=None)


def _runs(batches: list[NewMessages]) -> list[NewMessages]:
    """Consecutive ``batches`` that share a queue, a schedule, a priority and an expiry,
    each run joined into one, in order."""
    runs: list[list[NewMessages]] = []
    for b in batches:
        if runs and _shape(runs[-1][0]) == _shape(b):
            runs[-1].append(b)
        else:
            runs.append([b])
    return [joined(run)[0] for run in runs]


def _shape(b: NewMessages) -> tuple[Any, ...]:
    return (b.queue, b.delay, b.at, b.priority, b.expires_in, b.expires_at, b.channel)


__all__ = ["StepPublish"]
