"""The lists an operator pages through on the SQL engines, in SQLAlchemy Core: a queue's
live messages by what they wait on (:mod:`sqlmq.waits`), and how many archived messages
a search matches (the count a bulk repair states before it starts).

Read-only, as :mod:`.insights` is. A queue's live messages are filtered by an expression
over each row (:func:`.waits.waits_of`), which no index holds: a page or a count reads the
queue's rows of the message table, as ``stats`` reads every queue's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ...schema import Schema
from ...views import ArchiveQuery, MessageView
from ...waits import LiveQuery
from .insights import archive_where, live_view
from .waits import waits_of


class Browsing:
    """``live_messages``, ``live_waits`` and ``count_archive`` of the engine contract."""

    db: AsyncEngine
    schema: Schema
    _read: Callable[[Any], Awaitable[list[Any]]]

    async def live_messages(self, query: LiveQuery) -> list[MessageView]:
        m = self.schema.message
        waits = waits_of(m)
        stmt = select(m, waits.label("waits")).where(m.c.queue == query.queue)
        if query.waits:
            stmt = stmt.where(waits.in_([w.value for w in query.waits]))
        if query.after is not None:
            stmt = stmt.where(m.c.id > query.after)
        return [live_view(r) for r in
                await self._read(stmt.order_by(m.c.id).limit(query.limit))]

    async def live_waits(self, queue: str) -> dict[str, int]:
        m = self.schema.message
        # grouped in an outer query: the expression holds a parameter (the clock), and a
        # GROUP BY that repeats it would not be the same expression to PostgreSQL
        rows = select(waits_of(m).label("waits")).where(m.c.queue == queue).subquery()
        stmt = select(rows.c.waits, func.count()).group_by(rows.c.waits)
        return {str(w): int(n) for w, n in await self._read(stmt)}

    async def count_archive(self, query: ArchiveQuery, most: int | None = None) -> int:
        a = self.schema.archive
        matching = select(a.c.id).where(*archive_where(a, query))
        if most is not None:
            matching = matching.limit(most)
        found = await self._read(select(func.count()).select_from(matching.subquery()))
        return int(found[0][0])


__all__ = ["Browsing"]
