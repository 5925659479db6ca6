"""What a workflow's status, the list of workflows and a step's handler read (see
:mod:`sqlmq.workflows`), in SQLAlchemy Core."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ....lifecycle import State
from ....schema import Schema
from ....workflows.records import Dependency, StepStatus, WorkflowSummary


class WorkflowReads:
    """``workflow_steps``, ``workflows`` and ``dependencies`` for
    :class:`~..engine.SqlEngine`."""

    schema: Schema
    _transaction: Callable[[Callable[[AsyncConnection], Awaitable[Any]]], Awaitable[Any]]

    async def workflow_steps(self, workflow: str) -> list[StepStatus]:
        s, n, m, a = (self.schema.step, self.schema.step_need, self.schema.message,
                      self.schema.archive)

        async def read(conn: AsyncConnection) -> list[StepStatus]:
            steps = (await conn.execute(select(s).where(s.c.workflow == workflow)
                                        .order_by(s.c.id))).all()
            if not steps:
                return []
            ids = [r.id for r in steps]
            names = {r.id: r.name for r in steps}
            after: dict[int, list[str]] = {}
            for step, needs in await conn.execute(select(n.c.step, n.c.needs)
                                                  .where(n.c.step.in_(ids))):
                after.setdefault(step, []).append(names.get(needs, str(needs)))
            live = {r.id: r for r in await conn.execute(
                select(m.c.id, m.c.state, m.c.attempts_count, m.c.last_error)
                .where(m.c.id.in_(ids)))}
            ended = {r.id: r for r in await conn.execute(
                select(a.c.id, a.c.state, a.c.attempts_count, a.c.error, a.c.result)
                .where(a.c.id.in_(ids)))}
            out = []
            for r in steps:
                row, done = live.get(r.id), ended.get(r.id)
                state = (done.state if done is not None else
                         row.state if row is not None else "UNKNOWN")
                out.append(StepStatus(
                    r.name, r.id, r.queue, state, sorted(after.get(r.id, [])),
                    (done or row).attempts_count if (done or row) is not None else 0,
                    done.error if done is not None else (row.last_error if row else None),
                    r.on_failure, done.result if done is not None else None))
            return out

        return await self._transaction(read)  # type: ignore[no-any-return]

    async def workflows(self, limit: int) -> list[WorkflowSummary]:
        s, a = self.schema.step, self.schema.archive
        done = case((a.c.state == State.COMPLETED.value, 1), else_=0)
        q = (select(s.c.workflow, func.count(), func.count(a.c.id), func.sum(done),
                    func.min(s.c.created_at).label("created"))
             .select_from(s.outerjoin(a, a.c.id == s.c.id))
             .group_by(s.c.workflow).order_by(func.min(s.c.created_at).desc(),
                                              s.c.workflow).limit(limit))

        async def read(conn: AsyncConnection) -> list[WorkflowSummary]:
            return [WorkflowSummary(w, int(total), int(ended), int(completed or 0), created)
                    for w, total, ended, completed, created in await conn.execute(q)]

        return await self._transaction(read)  # type: ignore[no-any-return]

    async def dependencies(self, msg_id: int) -> list[Dependency]:
        s, n, a = self.schema.step, self.schema.step_need, self.schema.archive
        q = (select(n.c.needs, s.c.name, a.c.state, a.c.error, a.c.result)
             .select_from(n.join(s, s.c.id == n.c.needs).outerjoin(a, a.c.id == n.c.needs))
             .where(n.c.step == msg_id).order_by(n.c.needs))

        async def read(conn: AsyncConnection) -> list[Dependency]:
            return [Dependency(name, needs, state or "UNKNOWN", error, result)
                    for needs, name, state, error, result in await conn.execute(q)]

        return await self._transaction(read)  # type: ignore[no-any-return]


__all__ = ["WorkflowReads"]
