"""Workflows' steps on the SQL engines, in SQLAlchemy Core (schema version 23; see
:mod:`sqlmq.workflows`): what the settle, cancel or requeue of a step does to the steps
waiting on it, in that transaction.

A step that waits is a message row in state WAITING with no due time and no channel, so no
acquire reads it, and a row in the step table with what its publish would have set
(:mod:`.publishing`). The
settle that ends a step's last dependency publishes it in its own transaction: the row
becomes PENDING, due now or after its delay, in its channel (a turn taken as a publish
takes one). Fencing comes with the settle: only the settlements its statements wrote end
anything, so a stale delivery releases nothing. Concurrent settles of two dependencies of
one step take the step's row lock in id order; the second sees the first's count.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlalchemy import (
    Table,
    and_,
    bindparam,
    case,
    delete,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from ....lifecycle import Outcome, State, history_entry
from ....records import Settlement
from ....schema import Schema
from ....sqltime import db_now_plus
from ....workflows.graph import Waiter, next_level, revived_counts
from ..lists import listed
from ..publish import run_flow
from ..room import room_flow
from .released import due_after_delays, released_one

_NOW = db_now_plus(literal(0.0))
_RELEASED, _CANCELLED, _WAITING = "RELEASED", State.CANCELLED.value, State.WAITING.value
#: The status of a step a dependency's failure cancelled: a requeue of that dependency
#: makes it wait again (a step cancelled by hand stays CANCELLED).
_CASCADED = "CASCADED"


class StepStatements:
    """The release, cancellation and revival of waiting steps in the transactions that end
    or requeue what they wait for, for :class:`~..engine.SqlEngine`."""

    schema: Schema
    LOCK_FOR_REQUEUE: bool
    _transaction: Callable[[Callable[[AsyncConnection], Awaitable[Any]]], Awaitable[Any]]
    _queue_wake_statement: Callable[[str], Executable | None]
    _saw_channels: Callable[[], None]
    _saw_free_channel: Callable[[], None]
    _archive_cancelled: Callable[..., Awaitable[None]]
    _announce: Callable[[AsyncConnection, Sequence[int]], Awaitable[None]]

    # ---- in a settle's or a cancel's transaction -----------------------------------------------

    async def _steps_settled(self, conn: AsyncConnection,
                             settlements: Sequence[Settlement]) -> None:
        """The steps that ``settlements`` (written by this settle) ended release or cancel
        what waits on them. A settle's outcome is the state it archives; a DEFER ended
        its message only if a cancel was asked for meanwhile, which the archive tells."""
        ended = {s.id: s.outcome.value for s in settlements if s.outcome.archives}
        deferred = sorted(s.id for s in settlements if s.outcome is Outcome.DEFER)
        if deferred:
            a = self.schema.archive
            ended.update((await conn.execute(select(a.c.id, a.c.state)
                                             .where(a.c.id.in_(deferred)))).all())
        if ended and all(v == State.COMPLETED for v in ended.values()):
            await self._steps_completed(conn, sorted(ended))
        elif ended:
            await self._steps_ended(conn, ended)

    async def _steps_completed(self, conn: AsyncConnection, ids: list[int]) -> None:
        """The common ending, every step ``ids`` COMPLETED, in statements whose text is the
        same whatever the number of steps (lists bound as one parameter, see
        :mod:`..lists`): what waits on them counts down in an UPDATE per number of them it
        waited on (one, mostly), and the plain steps that reach zero are released in
        another; a step due in a channel or at a moment takes :meth:`_release_steps`."""
        sc, s, dialect = self.schema, self.schema.step, conn.dialect
        edges = (await conn.execute(_edges(sc.step_need, dialect), {"p_ended": ids})).all()
        if not edges:
            return
        counts: dict[int, int] = {}
        for e in edges:
            counts[e.step] = counts.get(e.step, 0) + 1
        waiters = sorted(counts)
        if self.LOCK_FOR_REQUEUE:  # their messages' rows first: the order a cancel takes
            await conn.execute(_locked(sc.message, dialect), {"p_steps": waiters})
        by_count: dict[int, list[int]] = {}
        for step, count in counts.items():
            by_count.setdefault(count, []).append(step)
        ready = await self._counted_down(conn, waiters, by_count)
        apart = [r.id for r in ready if r.channel is not None or r.due_at is not None]
        plain = [r for r in ready if r.channel is None and r.due_at is None]
        if apart:
            await self._release_steps(conn, apart)
        if plain:
            for statement, params in due_after_delays(
                    sc.message, dialect, [(r.id, r.delay_seconds) for r in plain]):
                await conn.execute(statement, params)
            if not dialect.update_returning:
                await conn.execute(_statuses(s, dialect),
                                   {"p_ids": [r.id for r in plain], "p_status": _RELEASED})
            for queue in sorted({r.queue for r in plain}):
                wake = self._queue_wake_statement(queue)
                if wake is not None:
                    await conn.execute(wake)

    async def _counted_down(self, conn: AsyncConnection, waiters: list[int],
                            by_count: dict[int, list[int]]) -> list[Any]:
        """Count down the waiting steps ``waiters`` (``by_count``: the steps each number
        of their dependencies just ended); the ones that reach zero. Where an UPDATE
        returns rows (PostgreSQL, SQLite), the one that counts also says so, and marks
        the plain ones RELEASED; MariaDB reads them after."""
        s, dialect = self.schema.step, conn.dialect
        returning = dialect.update_returning
        ready: list[Any] = []
        for count, steps in sorted(by_count.items()):
            found = await conn.execute(_count_down_by(s, dialect, returning),
                                       {"p_steps": steps, "p_n": count})
            if returning:
                ready += [r for r in found if r.waiting <= 0]
        if not returning:
            ready = list((await conn.execute(_ready(s, dialect), {"p_steps": waiters})).all())
        return sorted(ready, key=lambda r: r.id)

    async def _steps_ended(self, conn: AsyncConnection, ended: dict[int, str]) -> None:
        """Messages ``ended`` (id to its final state) end as steps: each step waiting on
        them counts down, is released at zero, or is cancelled by a failure, and the
        cancelled end in turn, level by level."""
        s, n, m = self.schema.step, self.schema.step_need, self.schema.message
        while ended:
            edges = (await conn.execute(select(n.c.step, n.c.needs)
                                        .where(n.c.needs.in_(sorted(ended))))).all()
            if not edges:
                return
            steps = sorted({e.step for e in edges})
            # Their messages' rows first, then theirs: the order a cancel takes them in.
            rows = select(m.c.id).where(m.c.id.in_(steps)).order_by(m.c.id)
            if self.LOCK_FOR_REQUEUE:
                await conn.execute(rows.with_for_update())
            waiting = select(s.c.id, s.c.waiting, s.c.on_failure).where(
                s.c.id.in_(steps), s.c.status == _WAITING).order_by(s.c.id)
            if self.LOCK_FOR_REQUEUE:
                waiting = waiting.with_for_update()
            waiters = [Waiter(r.id, r.waiting, r.on_failure)
                       for r in await conn.execute(waiting)]
            if not waiters:
                return
            names = {} if all(v == State.COMPLETED for v in ended.values()) else dict(
                (await conn.execute(select(s.c.id, s.c.name)  # for the reasons of cancels
                                    .where(s.c.id.in_(sorted(ended))))).all())
            level = next_level(waiters, [(e.step, e.needs) for e in edges], ended, names)
            if level.waiting:
                await conn.execute(_count_down(s), [{"p_id": i, "p_waiting": w}
                                                    for i, w in level.waiting.items()])
            if level.released:
                await self._release_steps(conn, level.released)
            for msg_id, reason in level.cancelled.items():
                await self._archive_cancelled(conn, msg_id, None,
                                              [history_entry(0, "cancelled", error=reason)],
                                              reason)
            if level.cancelled:
                await conn.execute(_statuses(s, conn.dialect),
                                   {"p_ids": sorted(level.cancelled), "p_status": _CASCADED})
                await self._announce(conn, sorted(level.cancelled))
            ended = dict.fromkeys(level.cancelled, _CANCELLED)

    async def _release_steps(self, conn: AsyncConnection, ids: list[int]) -> None:
        """Publish the waiting steps ``ids``: due now or after their delay (or at their
        moment), in their channel with the turn a publish would give them."""
        s, m = self.schema.step, self.schema.message
        steps = (await conn.execute(
            select(s.c.id, s.c.queue, s.c.channel, s.c.delay_seconds, s.c.due_at, m.c.priority)
            .select_from(s.join(m, m.c.id == s.c.id))
            .where(listed(conn.dialect, s.c.id, "p_ids", "id"), m.c.state == _WAITING)
            .order_by(s.c.id), {"p_ids": ids})).all()
        keys: dict[int, tuple[int | None, int]] = {}
        by_channel: dict[tuple[str, str], list[Any]] = {}
        for r in steps:
            if r.channel is not None:
                by_channel.setdefault((r.channel, r.queue), []).append(r)
        for (channel, queue), rows in sorted(by_channel.items()):
            self._saw_channels()
            turns = await run_flow(conn, room_flow(self.schema, conn.dialect, channel, queue,
                                                   len(rows), refuse=False))
            if turns is not None:
                self._saw_free_channel()
            for i, r in enumerate(rows):
                keys[r.id] = ((None, 0) if turns is None
                              else (turns.key(r.priority, i), int(turns.ordered)))
        # Plain steps due after one delay, the most common case, in one statement each;
        # the others (a channel's turn, a moment) a row at a time.
        for statement, params in due_after_delays(
                m, conn.dialect, [(r.id, r.delay_seconds) for r in steps
                                  if r.channel is None and r.due_at is None]):
            await conn.execute(statement, params)
        for at in (False, True):
            params = [{"p_id": r.id, "p_channel": r.channel,
                       "p_key": keys.get(r.id, (None, 0))[0],
                       "p_ordered": keys.get(r.id, (None, 0))[1],
                       **({"p_at": r.due_at} if at else {"p_delay": r.delay_seconds or 0.0})}
                      for r in steps if (r.due_at is not None) == at
                      and (r.channel is not None or at)]
            if params:
                await conn.execute(released_one(m, at), params)
        await conn.execute(_statuses(s, conn.dialect), {"p_ids": [r.id for r in steps],
                                          "p_status": _RELEASED})
        for queue in sorted({r.queue for r in steps}):
            wake = self._queue_wake_statement(queue)
            if wake is not None:
                await conn.execute(wake)

    async def _steps_requeued(self, conn: AsyncConnection, ids: Sequence[int]) -> None:
        """Requeued messages ``ids`` that are steps run again, so the steps their failure
        cancelled wait for them again, and so on down: each back in the table as WAITING
        (its archive row moved), its count of dependencies not yet ended made anew; one
        that another failed dependency still holds back stays cancelled."""
        s, n, m, a = (self.schema.step, self.schema.step_need, self.schema.message,
                      self.schema.archive)
        frontier = list((await conn.execute(select(s.c.id).where(s.c.id.in_(sorted(ids)))
                                            )).scalars())
        if frontier:
            await conn.execute(update(s).where(s.c.id.in_(frontier)).values(status=_RELEASED))
        while frontier:
            found = select(s.c.id, s.c.on_failure).where(
                s.c.id.in_(select(n.c.step).where(n.c.needs.in_(frontier))),
                s.c.status == _CASCADED).order_by(s.c.id)
            if self.LOCK_FOR_REQUEUE:
                found = found.with_for_update()
            cancelled = {r.id: r.on_failure for r in await conn.execute(found)}
            if not cancelled:
                return
            needs: dict[int, list[int]] = {}
            for step, need in await conn.execute(select(n.c.step, n.c.needs)
                                                 .where(n.c.step.in_(sorted(cancelled)))):
                needs.setdefault(step, []).append(need)
            ended = dict((await conn.execute(select(a.c.id, a.c.state).where(
                a.c.id.in_(sorted({d for ds in needs.values() for d in ds}))))).all())
            counts = revived_counts(cancelled, needs, ended)
            if not counts:
                return
            back = sorted(counts)
            await conn.execute(insert(m).from_select(
                ["id", "queue", "headers", "payload", "state", "attempts_count",
                 "deliveries_count", "created_at", "history", "priority"],
                select(a.c.id, a.c.queue, a.c.headers, a.c.payload, literal(_WAITING),
                       literal(0), literal(0), a.c.created_at, a.c.history, a.c.priority)
                .where(a.c.id.in_(back))))
            await conn.execute(delete(a).where(a.c.id.in_(back)))
            await conn.execute(update(s).where(s.c.id == bindparam("p_id")).values(
                status=_WAITING, waiting=bindparam("p_waiting")),
                [{"p_id": i, "p_waiting": w} for i, w in counts.items()])
            frontier = back

    async def _cancelled_step(self, conn: AsyncConnection, msg_id: int) -> None:
        """Message ``msg_id``, just archived CANCELLED by ``cancel``, ends as a step (if
        it is one): no longer waiting itself, and what waits on it follows."""
        await conn.execute(_statuses(self.schema.step, conn.dialect),
                           {"p_ids": [msg_id], "p_status": _CANCELLED})
        await self._steps_ended(conn, {msg_id: _CANCELLED})


@functools.lru_cache(maxsize=16)
def _edges(n: Table, dialect: Dialect) -> Any:
    """The dependencies on any of ``p_ended``: (step, needs)."""
    return select(n.c.step, n.c.needs).where(listed(dialect, n.c.needs, "p_ended", "id"))


@functools.lru_cache(maxsize=16)
def _locked(m: Table, dialect: Dialect) -> Any:
    """The rows of messages ``p_steps`` locked, in id order."""
    return select(m.c.id).where(listed(dialect, m.c.id, "p_steps", "id")).order_by(
        m.c.id).with_for_update()


@functools.lru_cache(maxsize=16)
def _count_down_by(s: Table, dialect: Dialect, returning: bool) -> Any:
    """The waiting steps ``p_steps`` count ``p_n`` more of their dependencies ended (their
    rows are locked: the count read is the latest). With ``returning``, the plain ones
    that reach zero become RELEASED in the same UPDATE, which returns what the release
    needs (MariaDB, which cannot return, evaluates a SET's assignments in order, so
    there the count alone)."""
    left = s.c.waiting - bindparam("p_n", type_=s.c.waiting.type)
    counted = update(s).where(listed(dialect, s.c.id, "p_steps", "id"), s.c.status == _WAITING)
    if not returning:
        return counted.values(waiting=left)
    released = case((and_(left <= 0, s.c.channel.is_(None), s.c.due_at.is_(None)),
                     literal(_RELEASED)), else_=s.c.status)
    return counted.values(waiting=left, status=released).returning(
        s.c.id, s.c.queue, s.c.channel, s.c.due_at, s.c.delay_seconds, s.c.waiting)


@functools.lru_cache(maxsize=16)
def _ready(s: Table, dialect: Dialect) -> Any:
    """The steps among ``p_steps`` that wait on nothing any more."""
    return select(s.c.id, s.c.queue, s.c.channel, s.c.due_at, s.c.delay_seconds).where(
        listed(dialect, s.c.id, "p_steps", "id"), s.c.status == _WAITING,
        s.c.waiting <= 0).order_by(s.c.id)


@functools.lru_cache(maxsize=16)
def _count_down(s: Table) -> Any:
    return update(s).where(s.c.id == bindparam("p_id")).values(waiting=bindparam("p_waiting"))


@functools.lru_cache(maxsize=16)
def _statuses(s: Table, dialect: Dialect) -> Any:
    """The waiting steps ``p_ids`` take status ``p_status``."""
    return update(s).where(listed(dialect, s.c.id, "p_ids", "id"),
                           s.c.status == _WAITING).values(status=bindparam("p_status"))


__all__ = ["StepStatements"]
