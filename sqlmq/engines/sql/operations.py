"""The live workers registry and paused queues on the SQL engines, in SQLAlchemy Core (schema
version 11; the broker's side is :mod:`sqlmq.operations` and
:mod:`sqlmq.maintenance.heartbeat`).

None of this is on the hot path: a heartbeat every few seconds per broker, and an
operator's pause or resume now and then. What the hot path pays for pauses is in each
database's acquire statements (``sql/<database>.py``: one primary-key probe of the tiny
pause table per queue), in the channels' acquire (:mod:`.channels`, through
:func:`not_paused`) and in the hand-over of a publish (``INSERT_LEASED``).

Heartbeats write only their own row; the sweep of dead rows is a transaction of its own,
after the beat's, so a beat never waits for a row lock it does not own while holding its
own: two brokers sweeping and beating at once cannot deadlock.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import delete, insert, literal, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ColumnElement, Executable

from ...records import PausedQueue, WorkerBeat, WorkerInfo
from ...schema import MAX_HOST, Schema
from ...sqltime import db_now_plus

_NOW = db_now_plus(literal(0.0))


def not_paused(schema: Schema, queue: ColumnElement[Any]) -> ColumnElement[bool]:
    """The condition that the queue ``queue`` (a column of the message table) is not paused:
    for statements that take messages, read in their own statement so that a pause is
    exact across processes."""
    p = schema.queue_pause
    return queue.not_in(select(p.c.queue))


class OperationStatements:
    """The workers registry and the pauses, for :class:`~.engine.SqlEngine`."""

    schema: Schema
    #: The engine's transaction runner (settle_onward's, PostgreSQL's retrying one).
    _transaction: Callable[[Callable[[AsyncConnection], Awaitable[Any]]], Awaitable[Any]]

    def _queue_wake_statement(self, queue: str) -> Executable | None:
        """What wakes the consumers of ``queue`` in other processes when it commits (a
        resume): PostgreSQL's NOTIFY; None where they find out on their next poll."""
        return None

    # ---- the workers registry ----------------------------------------------------------------

    async def heartbeat(self, beat: WorkerBeat) -> int:
        w = self.schema.worker
        values = {"host": beat.host[:MAX_HOST], "pid": beat.pid, "version": beat.version[:64],
                  "subscribers": beat.subscribers, "running": beat.running,
                  "held": beat.held, "heartbeat_at": _NOW,
                  "expires_at": db_now_plus(literal(float(beat.ttl)))}

        async def write(conn: AsyncConnection) -> None:
            found = await conn.execute(update(w).where(w.c.id == beat.id).values(**values))
            if not found.rowcount:  # the first beat (or one after a sweep took it for dead)
                await conn.execute(insert(w).values(id=beat.id, started_at=_NOW, **values))

        async def sweep(conn: AsyncConnection) -> int:
            return int((await conn.execute(delete(w).where(w.c.expires_at < _NOW))).rowcount)

        await self._transaction(write)
        return int(await self._transaction(sweep))

    async def leave(self, worker_id: str) -> None:
        w = self.schema.worker

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(delete(w).where(w.c.id == worker_id))

        await self._transaction(write)

    async def workers(self) -> list[WorkerInfo]:
        w = self.schema.worker

        async def read(conn: AsyncConnection) -> list[Any]:
            return list((await conn.execute(
                select(w).where(w.c.expires_at > _NOW)
                .order_by(w.c.host, w.c.pid, w.c.started_at, w.c.id))).all())

        return [WorkerInfo(r.id, r.host, r.pid, r.version, r.started_at, r.heartbeat_at,
                           r.expires_at, _subscribers(r.subscribers), r.running, r.held)
                for r in await self._transaction(read)]

    # ---- pauses ------------------------------------------------------------------------------

    async def pause(self, queue: str) -> bool:
        p = self.schema.queue_pause

        async def write(conn: AsyncConnection) -> bool:
            if (await conn.execute(select(p.c.queue).where(p.c.queue == queue))).first():
                return False
            await conn.execute(insert(p).values(queue=queue, paused_at=_NOW))
            return True

        try:
            return bool(await self._transaction(write))
        except IntegrityError:  # another process paused it meanwhile
            return False

    async def resume(self, queue: str) -> bool:
        p = self.schema.queue_pause
        wake = self._queue_wake_statement(queue)

        async def write(conn: AsyncConnection) -> bool:
            if not (await conn.execute(delete(p).where(p.c.queue == queue))).rowcount:
                return False
            if wake is not None:
                await conn.execute(wake)
            return True

        return bool(await self._transaction(write))

    async def paused(self) -> list[PausedQueue]:
        p = self.schema.queue_pause

        async def read(conn: AsyncConnection) -> list[Any]:
            return list((await conn.execute(select(p).order_by(p.c.queue))).all())

        return [PausedQueue(r.queue, r.paused_at) for r in await self._transaction(read)]


def _subscribers(value: Any) -> list[dict[str, Any]]:
    """The JSON column as read back (MariaDB's JSON is text to some drivers)."""
    if isinstance(value, str | bytes):
        value = json.loads(value)
    return list(value) if isinstance(value, list) else []


__all__ = ["OperationStatements", "not_paused"]
