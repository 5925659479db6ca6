"""Defer and cancellation on the SQL engines, in SQLAlchemy Core (schema version 9).

Both are rare next to acks and retries, so they stay out of each engine's one-statement
settle: a batch that holds a DEFER or CANCEL settlement is settled in one transaction, the
engine's statements for the rest and these for those (see
:class:`~sqlmq.engines.sql.settle_onward.OnwardSettle`).

Fencing is the same as everywhere: each write is conditional on ``(id, deliveries)`` and
state PROCESSING, so a stale defer or cancel writes nothing. A defer of a message whose
cancellation was asked for meanwhile archives it CANCELLED instead (it would run again).

``cancel`` locks the message's row and acts on what it finds: a waiting message is archived
CANCELLED in that transaction, a running one is flagged (``cancel_requested``), which its
runtime reads when it renews leases and every acquire returns (a flagged message that went
back to waiting is archived CANCELLED without running; see
:func:`sqlmq.lifecycle.unrunnable`).

Every archiving here goes through ``_archive_cancelled``, which first runs the engine's
dead-letter statement (``_dead_letter_statement``: PostgreSQL's NOTIFY, None elsewhere) in
the same transaction: a cancellation rolled back, or fenced out, announces nothing.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlalchemy import Float, Table, bindparam, case, delete, insert, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from ...lifecycle import Outcome, Settlement, State, append_history, history_entry
from ...records import Cancellation
from ...schema import Schema
from ...sqltime import db_now_plus, stamped_history

#: The outcomes written here rather than by the engine's settle statements.
CONTROL_OUTCOMES = frozenset({Outcome.DEFER, Outcome.CANCEL})

_NOW = db_now_plus(literal(0.0))


class ControlStatements:
    """The defer and cancellation half of the engine contract for
    :class:`~.engine.SqlEngine`."""

    schema: Schema
    #: Whether SELECT … FOR UPDATE exists (not on SQLite, whose write transactions hold
    #: every other writer off anyway).
    LOCK_FOR_REQUEUE: bool
    #: The engine's transaction runner (settle_onward's, PostgreSQL's retrying one).
    _transaction: Callable[[Callable[[AsyncConnection], Awaitable[Any]]], Awaitable[Any]]
    #: The engine's dead-letter NOTIFY of a row it archives, or None (see
    #: :meth:`~.engine.SqlEngine._dead_letter_statement`).
    _dead_letter_statement: Callable[[int, int | None, str], Executable | None]
    #: Tells waiting callers that messages ended (see :mod:`.results`).
    _announce: Callable[[AsyncConnection, Sequence[int]], Awaitable[None]]
    #: Ends a cancelled message as a workflow's step (see :mod:`.workflows`).
    _cancelled_step: Callable[[AsyncConnection, int], Awaitable[None]]
    #: Whether a signal the defer would wait for came already (see :mod:`.workflows.signals`).
    _signal_came: Callable[[AsyncConnection, int, str], Awaitable[bool]]

    async def cancel(self, msg_id: int) -> Cancellation:
        m, a = self.schema.message, self.schema.archive

        async def work(conn: AsyncConnection) -> Cancellation:
            found = select(m.c.state, m.c.deliveries_count, m.c.history).where(m.c.id == msg_id)
            if self.LOCK_FOR_REQUEUE:
                found = found.with_for_update()
            row = (await conn.execute(found)).first()
            if row is None:
                state = (await conn.execute(
                    select(a.c.state).where(a.c.id == msg_id))).scalar_one_or_none()
                return Cancellation(msg_id, "unknown" if state is None else "archived", state)
            if row.state == State.PROCESSING:
                await conn.execute(update(m).where(m.c.id == msg_id)
                                   .values(cancel_requested=1))
                return Cancellation(msg_id, "requested", State.PROCESSING)
            history = append_history(_history(row.history),
                                     history_entry(row.deliveries_count, "cancelled"))
            await self._archive_cancelled(conn, msg_id, None, history)
            await self._announce(conn, [msg_id])  # a caller may wait for it (results)
            await self._cancelled_step(conn, msg_id)  # what waits on it, if it is a step
            return Cancellation(msg_id, "cancelled", State.CANCELLED)

        return await self._transaction(work)

    async def cancel_requests(self, ids: Sequence[int]) -> set[int]:
        if not ids:
            return set()
        m = self.schema.message

        async def read(conn: AsyncConnection) -> set[int]:
            rows = await conn.execute(select(m.c.id).where(
                m.c.id.in_(list(ids)), m.c.cancel_requested == 1))
            return {r.id for r in rows}

        return await self._transaction(read)

    async def _settle_control(self, conn: AsyncConnection,
                              settlements: Sequence[Settlement]) -> set[int]:
        """Write the DEFER and CANCEL settlements in ``conn``'s transaction; the ids that
        landed (fenced, as every settle is)."""
        m = self.schema.message
        held = _held(m, self.LOCK_FOR_REQUEUE)
        written: set[int] = set()
        for s in sorted(settlements, key=lambda s: s.id):  # row locks in id order
            flag = (await conn.execute(held, {"p_id": s.id, "p_deliveries": s.deliveries})
                    ).scalar_one_or_none()
            if flag is None:
                continue  # stale: another delivery holds it now, or it ended
            if s.outcome is Outcome.CANCEL or flag:
                await self._archive_cancelled(conn, s.id, s.deliveries, s.history,
                                              s.error or "cancelled", keep=s.keep)
            else:
                params = {"p_id": s.id, "p_state": s.saved_state, "p_history": s.history,
                          "p_waits": s.waits_for}
                at = s.at
                if s.waits_for is not None and await self._signal_came(conn, s.id,
                                                                       s.waits_for):
                    at, params["p_delay"] = None, 0.0  # it came before the wait: due now
                else:
                    params.update({"p_delay": float(s.delay)} if at is None else {"p_at": at})
                await conn.execute(_defer(m, at is not None, s.history is not None), params)
            written.add(s.id)
        return written

    async def _archive_cancelled(self, conn: AsyncConnection, msg_id: int,
                                 deliveries: int | None, history: Any,
                                 error: str = "cancelled", keep: bool = True) -> None:
        """Move row ``msg_id`` to the archive as CANCELLED (locked by the caller); with
        ``keep`` False (the subscriber's ``archive=``), delete it instead. Either way it is a
        dead letter: the engine's NOTIFY of it (PostgreSQL) goes first, in this transaction,
        while the row is still there to name its queue."""
        m, a = self.schema.message, self.schema.archive
        notify = self._dead_letter_statement(msg_id, deliveries, State.CANCELLED.value)
        if notify is not None:
            await conn.execute(notify)
        if keep:
            params = {"p_id": msg_id, "p_error": error, "p_deliveries": deliveries,
                      "p_history": history}
            await conn.execute(_cancelled_copy(m, a, deliveries is not None,
                                               history is not None), params)
        await conn.execute(_drop(m), {"p_id": msg_id})


@functools.lru_cache(maxsize=64)
def _held(m: Table, lock: bool) -> Any:
    """Whether delivery ``p_deliveries`` of message ``p_id`` still holds it (a row), and
    whether its cancellation was asked for; its row locked where ``lock``. Built once, as
    :func:`_defer` is (see :func:`.publish._insert`)."""
    held = select(m.c.cancel_requested).where(
        m.c.id == bindparam("p_id"), m.c.deliveries_count == bindparam("p_deliveries"),
        m.c.state == State.PROCESSING)
    return held.with_for_update() if lock else held


@functools.lru_cache(maxsize=64)
def _defer(m: Table, at: bool, history: bool) -> Any:
    """Message ``p_id`` back to waiting with its saved state ``p_state`` and the signal it
    waits for ``p_waits``, due at moment
    ``p_at`` (``at``) or after ``p_delay`` seconds on the database clock, its history
    ``p_history`` (``history``, its newest entry at the database's time; else kept). Built
    on every defer, the two statements were most of the Python time of its settle (a
    profile of messages deferring themselves)."""
    due = (bindparam("p_at", type_=m.c.next_attempt_at.type) if at
           else db_now_plus(bindparam("p_delay", type_=Float())))
    return update(m).where(m.c.id == bindparam("p_id")).values(
        state=State.PENDING.value, lease_expires_at=None,
        # a channel's message waits apart (see sqlmq.channels)
        next_attempt_at=case((m.c.channel.is_(None), due)),
        channel_due_at=case((m.c.channel.is_not(None), due)),
        saved_state=bindparam("p_state", type_=m.c.saved_state.type),
        waits_for=bindparam("p_waits", type_=m.c.waits_for.type),
        defers_count=m.c.defers_count + 1,
        history=_new_history(m) if history else m.c.history)


@functools.lru_cache(maxsize=64)
def _cancelled_copy(m: Table, a: Table, fenced: bool, history: bool) -> Any:
    """Row ``p_id`` copied into the archive as CANCELLED with error ``p_error``, if delivery
    ``p_deliveries`` still holds it (``fenced``), with history ``p_history`` (``history``,
    its newest entry at the database's time; else its own). Built once, as :func:`_defer`
    is."""
    src = select(
        m.c.id, m.c.queue, m.c.headers, m.c.payload, literal(State.CANCELLED.value),
        m.c.attempts_count, m.c.deliveries_count, m.c.created_at, m.c.first_attempt_at,
        m.c.last_attempt_at, _NOW, bindparam("p_error", type_=a.c.error.type),
        _new_history(m) if history else m.c.history, m.c.priority, m.c.channel,
    ).where(m.c.id == bindparam("p_id"))
    if fenced:
        src = src.where(m.c.deliveries_count == bindparam("p_deliveries"))
    return insert(a).from_select(
        ["id", "queue", "headers", "payload", "state", "attempts_count", "deliveries_count",
         "created_at", "first_attempt_at", "last_attempt_at", "archived_at", "error",
         "history", "priority", "channel"], src)


def _new_history(m: Table) -> Any:
    """``p_history``, the history the runtime made (it appended an entry but read no clock),
    with the database's time on that entry, as the settle statements write it."""
    return stamped_history(bindparam("p_history", type_=m.c.history.type))


@functools.lru_cache(maxsize=64)
def _drop(m: Table) -> Any:
    return delete(m).where(m.c.id == bindparam("p_id"))


def _history(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str | bytes):
        value = json.loads(value)
    return list(value) if isinstance(value, list) else []


__all__ = ["CONTROL_OUTCOMES", "ControlStatements"]
