"""SQLite's channel statements (see :mod:`..sql.channels`, :mod:`..sql.fair` and
:mod:`..sql.slots` for what each does on every SQL database): straight on aiosqlite, one
trip to the driver's thread each, plain tuples back, decoded after the commit. Through
SQLAlchemy's cursor each statement was three trips, every one waiting its turn on an event
loop that runs the handlers, with the database's one write lock held meanwhile."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from ...records import Delivery
from ..sql.fair import Transaction, moved_clocks
from ..sql.statements import channel_fields, render
from . import statements as sql
from .rows import DueRow, FairRow, HeadRow, SlotRow, decoded, fetch

#: What the fair acquire's transaction returns: the rows taken (decoded after the commit),
#: the pick (id: channel, due time), the ordered channels among them, the clocks moved.
_FairTaken = tuple[list[Any], dict[int, tuple[str, Any]], set[str], dict[str, int]]


class SqliteChannels:
    """The channel statements of :class:`~.engine.SqliteEngine`."""

    names: dict[str, object]
    _transaction: Transaction
    _fair_spread: dict[tuple[str, ...], int]
    #: Per queue: the last clock turn this engine wrote (see _acquire_fair).
    _clocks: dict[str, int]
    _take_channel_sql: str
    _slot_limits_sql: str
    _due_per_channel_sql: str

    @cached_property
    def _fair_statements(self) -> tuple[str, str, str, str, str]:
        """FAIR_PICK (one queue), FAIR_PICK_QUEUES, FAIR_LET_IN, FAIR_CLOCK and
        NEXT_IN_ORDER, rendered once."""
        fields = channel_fields(self.names)
        return (render(sql.FAIR_PICK, fields), render(sql.FAIR_PICK_QUEUES, fields),
                render(sql.FAIR_LET_IN, fields), render(sql.FAIR_CLOCK, fields),
                render(sql.NEXT_IN_ORDER, fields))

    async def _slot_rows(self, conn: AsyncConnection, names: list[str]) -> list[SlotRow]:
        rows = await fetch(conn, self._slot_limits_sql, {"names": json.dumps(names)})
        return [SlotRow._make(r) for r in rows]

    async def _due_rows(self, conn: AsyncConnection, names: list[str],
                        queues: Sequence[str], most: int) -> list[DueRow]:
        rows = await fetch(conn, self._due_per_channel_sql, {
            "names": json.dumps(names), "queues": json.dumps(list(queues)), "most": most})
        return [DueRow._make(r) for r in rows]

    async def _acquire_fair(self, queues: Sequence[str], limit: int,
                            lease: float) -> list[Delivery]:
        """The fair acquire (:meth:`..sql.fair.FairAcquire._acquire_fair`): the pick, the
        take, the letting in of ordered channels' next messages and the queues' clocks, in
        one write transaction (no row locks: BEGIN IMMEDIATE holds every other writer
        off), the rows decoded after its commit."""
        pick, pick_queues, let_in, clock, _ = self._fair_statements
        if len(queues) == 1:
            params: dict[str, Any] = {"queue": queues[0], "most": limit}
        else:
            pick, params = pick_queues, {"queues": json.dumps(list(queues)), "most": limit}

        async def take(conn: AsyncConnection) -> _FairTaken:
            rows = [FairRow._make(r) for r in await fetch(conn, pick, params)]
            if not rows:
                return [], {}, set(), {}
            picked = {r.id: (r.channel, r.channel_due_at) for r in rows}
            taken = await self._take_rows(conn, picked, lease)
            ordered = {r.channel for r in rows if r.ordered}
            if ordered:
                await fetch(conn, let_in, {"names": json.dumps(sorted(ordered))})
            moved = moved_clocks(rows, self._clocks)
            for queue, turn in moved.items():
                await fetch(conn, clock, {"queue": queue, "turn": turn})
            return taken, picked, ordered, moved

        taken, picked, ordered, moved = await self._transaction(take)
        self._clocks.update(moved)
        out = self._taken(taken, picked, ordered, ordered)
        self._fair_spread[tuple(queues)] = len({d.channel for d in out})
        return out

    async def _let_in(self, conn: AsyncConnection, names: list[str]) -> None:
        await fetch(conn, self._fair_statements[2], {"names": json.dumps(names)})

    async def _next_heads(self, conn: AsyncConnection, names: list[str],
                          queues: Sequence[str]) -> list[HeadRow]:
        rows = await fetch(conn, self._fair_statements[4], {
            "names": json.dumps(names), "queues": json.dumps(list(queues))})
        return [HeadRow._make(r) for r in rows]

    async def _take(self, conn: AsyncConnection, picked: dict[int, tuple[str, Any]],
                    lease: float, holding: set[str],
                    passing: set[str] | frozenset[str] = frozenset()) -> list[Delivery]:
        return self._taken(await self._take_rows(conn, picked, lease), picked, holding,
                           passing)

    async def _take_rows(self, conn: AsyncConnection, picked: dict[int, tuple[str, Any]],
                         lease: float) -> list[Any]:
        """As the plain acquire takes its rows (a slot passed on by a settle spent half its
        6 ms between two handlers in the pass's three statements through SQLAlchemy)."""
        return await fetch(conn, self._take_channel_sql,
                           {"ids": json.dumps(sorted(picked)), "lease": lease})

    def _taken(self, rows: list[Any], picked: dict[int, tuple[str, Any]],
               holding: set[str], passing: set[str] | frozenset[str]) -> list[Delivery]:
        """The deliveries of the ``rows`` :meth:`_take_rows` took, in ``picked``'s order,
        decoded as the plain acquire's are."""
        out = decoded(rows, {msg_id: due for msg_id, (_, due) in picked.items()})
        for d in out:
            channel = d.channel = picked[d.id][0]
            d.holds_slot, d.passes_slot = channel in holding, channel in passing
        order = {msg_id: i for i, msg_id in enumerate(picked)}
        out.sort(key=lambda d: order[d.id])
        return out


__all__ = ["SqliteChannels"]
