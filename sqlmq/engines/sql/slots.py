"""A freed channel slot passed straight on, on the SQL engines (the contract's
``settle_passing``; PostgreSQL's fast path is one statement, ``SETTLE_PASSING``).

A limited channel's freed slot otherwise waits for the next acquire, and the limited
acquire locks its channels, counts their running deliveries again and marks them served:
five or six statements. Through a drain of 8 channels limited to 2 with 10 ms handlers, a
slot spent almost as long between two handlers as in them (``bench.slot_cycle``). The
settle that frees a slot can start the channel's next message itself: one ends and one
starts in one transaction, so the channel's running count never grows, and neither the
channel's lock nor a recount is needed to stay within the limit, whatever other processes
do meanwhile. The count read here only keeps a lowered limit from being passed on.

Only a channel whose one limit is ``max_concurrency`` passes its slots on
(:func:`sqlmq.channels.passed_on`), and an ordered channel without other limits its turn:
its next message in key order, once nothing of it runs, which no other process can start
meanwhile (its head comes first until this commits). The subscriber asks only while it has
workers to spare and its fetcher is caught up, so the acquire's order decides whenever
the workers are the limit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from ...channels import freed_slots, passed_on
from ...lifecycle import Settlement
from ...records import Delivery
from .room import effective

if TYPE_CHECKING:
    from datetime import datetime

    from .channels import ChannelSql


class SlotPassing:
    """The contract's ``settle_passing`` for :class:`~.engine.SqlEngine`."""

    if TYPE_CHECKING:
        _channel_sql: ChannelSql
        _transaction: Callable[[Callable[[AsyncConnection], Awaitable[Any]]], Awaitable[Any]]

        async def _settle_onward(self, conn: AsyncConnection,
                                 settlements: Sequence[Settlement]) -> set[int]: ...

        async def _take(self, conn: AsyncConnection,
                        picked: dict[int, tuple[str, datetime]], lease: float,
                        holding: set[str], passing: set[str]) -> list[Delivery]: ...

        async def _pass_heads(self, conn: AsyncConnection, names: list[str],
                              queues: Sequence[str], lease: float) -> list[Delivery]: ...

        async def _due_rows(self, conn: AsyncConnection, names: list[str],
                            queues: Sequence[str], most: int) -> Sequence[Any]: ...

    async def settle_passing(self, settlements: Sequence[Settlement],
                             slots: Mapping[int, str], queues: Sequence[str], lease: float,
                             most: int) -> tuple[set[int], list[Delivery]]:
        async def work(conn: AsyncConnection) -> tuple[set[int], list[Delivery]]:
            applied = await self._settle_onward(conn, settlements)
            freed = freed_slots(applied, slots)
            if not freed or most <= 0:
                return applied, []
            return applied, await self._pass_slots(conn, freed, queues, lease, most)

        return await self._transaction(work)

    async def _pass_slots(self, conn: AsyncConnection, freed: dict[str, int],
                          queues: Sequence[str], lease: float,
                          most: int) -> list[Delivery]:
        """Start the messages of the ``freed`` slots that may be passed on, counted after
        the settle in this transaction, ``most`` in all: a concurrency-limited channel's
        next due messages, an ordered channel's next in order
        (:meth:`.fair.FairAcquire._pass_heads`)."""
        plan: dict[str, int] = {}
        heads: list[str] = []
        for r in await self._slot_rows(conn, sorted(freed)):
            settings = effective(r)
            n = min(passed_on(settings, freed[r.name], r.running), most)
            if n > 0:
                most -= n
                if settings.ordered:
                    heads.append(r.name)
                else:
                    plan[r.name] = n
        started = await self._pass_heads(conn, heads, queues, lease) if heads else []
        if not plan:
            return started
        found = await self._due_rows(conn, sorted(plan), queues, max(plan.values()))
        picked = {r.id: (r.channel, r.channel_due_at) for r in found
                  if r.rn <= plan[r.channel]}
        if not picked:
            return started
        return started + await self._take(conn, picked, lease, set(plan), set(plan))

    async def _slot_rows(self, conn: AsyncConnection, names: list[str]) -> Sequence[Any]:
        """The channels ``names``: their settings as :func:`~.room.effective` reads
        them, and how many of their messages run (``running``). (SQLite runs its own
        statement straight on the driver.)"""
        return (await conn.execute(self._channel_sql.slot_limits, {"names": names})).all()


__all__ = ["SlotPassing"]
