"""Signals on the SQL engines, in SQLAlchemy Core (schema version 23; see
:mod:`sqlmq.workflows`): a message deferred by ``msg.wait_for(name)`` waits in the table
with ``waits_for`` set; ``Broker.signal`` keeps the signal and makes such a message due at
once. Both sides lock the message's row (the signal here, the defer in the settle's
``_held``), so a signal sent while the handler is still running is found by its defer, and
one sent after the defer finds the message waiting: none is missed."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, case, delete, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from ....lifecycle import State
from ....schema import Schema
from ....sqltime import db_now_plus
from ....workflows.records import Signal

_NOW = db_now_plus(literal(0.0))
_WAITING_STATES = (State.PENDING.value, State.RETRYABLE.value)


class SignalStatements:
    """``signal`` and ``received_signal`` for :class:`~..engine.SqlEngine`, and what a
    defer that waits for a signal asks (:meth:`_signal_came`)."""

    schema: Schema
    LOCK_FOR_REQUEUE: bool
    _transaction: Callable[[Callable[[AsyncConnection], Awaitable[Any]]], Awaitable[Any]]
    _queue_wake_statement: Callable[[str], Executable | None]

    async def signal(self, msg_id: int, name: str, payload: bytes | None) -> bool:
        m, g = self.schema.message, self.schema.signal

        async def work(conn: AsyncConnection) -> bool:
            found = select(m.c.queue, m.c.state, m.c.waits_for).where(m.c.id == msg_id)
            if self.LOCK_FOR_REQUEUE:
                found = found.with_for_update()
            row = (await conn.execute(found)).first()
            if row is None:
                return False  # ended, or never was
            await conn.execute(delete(g).where(g.c.message_id == msg_id, g.c.name == name))
            await conn.execute(g.insert().values(message_id=msg_id, name=name,
                                                 payload=payload, sent_at=_NOW))
            if row.waits_for == name and row.state in _WAITING_STATES:
                await conn.execute(_due_now(m), {"p_id": msg_id})
                wake = self._queue_wake_statement(row.queue)
                if wake is not None:
                    await conn.execute(wake)
            return True

        return await self._transaction(work)  # type: ignore[no-any-return]

    async def received_signal(self, msg_id: int, deliveries: int) -> Signal | None:
        m, g = self.schema.message, self.schema.signal

        async def work(conn: AsyncConnection) -> Signal | None:
            waits = (await conn.execute(select(m.c.waits_for).where(m.c.id == msg_id))
                     ).scalar_one_or_none()
            if waits is None:
                return None
            row = (await conn.execute(select(g.c.payload, g.c.sent_at).where(
                g.c.message_id == msg_id, g.c.name == waits))).first()
            if row is None:
                return Signal(waits)  # its timeout came first
            await conn.execute(update(g).where(g.c.message_id == msg_id, g.c.name == waits)
                               .values(read_by=deliveries))
            return Signal(waits, row.payload, row.sent_at)

        return await self._transaction(work)  # type: ignore[no-any-return]

    async def forget_ended_signals(self, before: datetime, limit: int) -> int:
        m, g = self.schema.message, self.schema.signal
        ended = ~select(m.c.id).where(m.c.id == g.c.message_id).exists()

        async def work(conn: AsyncConnection) -> int:
            found = list((await conn.execute(
                select(g.c.message_id).where(g.c.sent_at < before, ended).distinct()
                .order_by(g.c.message_id).limit(limit))).scalars())
            if found:
                await conn.execute(delete(g).where(g.c.message_id.in_(found),
                                                   g.c.sent_at < before, ended))
            return len(found)

        return await self._transaction(work)  # type: ignore[no-any-return]

    async def _signal_came(self, conn: AsyncConnection, msg_id: int, name: str) -> bool:
        """In a defer's transaction (the row locked): forget the signals a delivery read,
        and say whether signal ``name`` came and nobody read it yet."""
        g = self.schema.signal
        await conn.execute(delete(g).where(g.c.message_id == msg_id, g.c.read_by.is_not(None)))
        return (await conn.execute(select(g.c.name).where(
            g.c.message_id == msg_id, g.c.name == name))).first() is not None


@functools.lru_cache(maxsize=16)
def _due_now(m: Table) -> Any:
    """Message ``p_id``, waiting, due now: a channel's message apart from the plain ones."""
    return update(m).where(m.c.id == bindparam("p_id")).values(
        next_attempt_at=case((m.c.channel.is_(None), _NOW)),
        channel_due_at=case((m.c.channel.is_not(None), _NOW)))


__all__ = ["SignalStatements"]
