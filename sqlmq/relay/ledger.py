"""The inbox's ledger: a row per far message taken (table ``inbox_seen``, schema version
21), written in the transaction that publishes the message, so that whatever the far broker
delivers again is found there and written nothing.

A deduplication key alone would not do: it holds only while its message waits or runs, and a
far broker redelivers whenever an acknowledgement was lost (the inbox died between the
commit and the ack, the connection broke), possibly long after sqlmq handled and archived
the message. The ledger's primary key ``(source, msg_key)`` refuses a key taken before, on
every database alike (an ``IntegrityError``), so no dialect's upsert is needed: a batch is
one INSERT; if it collides, the keys already there are looked up and the rest written; if
that collides too (another inbox on the same source took some meanwhile), one message per
transaction.

Rows are kept for ``retention`` (7 days by default), then deleted in bounded batches; a far
message delivered again after that is taken again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from ..schema import Schema
    from .source import FarMessage

log = logging.getLogger("sqlmq")

#: Publishes ``messages`` on ``conn`` (the ledger's transaction); returns their ids in order.
Publish = Callable[["AsyncConnection", Sequence["FarMessage"]], Awaitable[Sequence[int]]]

#: Keys looked up per statement (well under every database's limit of parameters).
LOOKUP_CHUNK = 500


class _Known(Exception):
    """A key of the batch is in the ledger already (its primary key refused the rows)."""


@dataclass
class Written:
    """What one batch became: the messages published, and those the ledger had already."""

    taken: list[FarMessage]
    duplicates: list[FarMessage]


class Ledger:
    """The ledger rows of one source (its name in ``inbox_seen.source``)."""

    def __init__(self, db: AsyncEngine, schema: Schema, source: str,
                 retention: timedelta) -> None:
        self.db = db
        self.table = schema.inbox_seen
        self.source = source
        self.retention = retention

    async def write(self, messages: Sequence[FarMessage], publish: Publish) -> Written:
        """Publish the messages whose keys the ledger has not seen, with their ledger rows,
        in one transaction where it can. Each message must have a key; the first of a key
        met twice in ``messages`` is taken."""
        firsts: dict[str, FarMessage] = {}
        for m in messages:
            firsts.setdefault(m.key, m)  # type: ignore[arg-type]
        fresh = list(firsts.values())
        repeated = [m for m in messages if firsts[m.key] is not m]  # type: ignore[index]
        try:
            await self._commit(fresh, publish)
            return Written(fresh, repeated)
        except _Known:
            pass
        known = await self.known([m.key for m in fresh])  # type: ignore[misc]
        unseen = [m for m in fresh if m.key not in known]
        seen = [m for m in fresh if m.key in known]
        try:
            await self._commit(unseen, publish)
            return Written(unseen, repeated + seen)
        except _Known:
            pass
        taken = []
        for m in unseen:  # another inbox on this source is taking them too
            try:
                await self._commit([m], publish)
                taken.append(m)
            except _Known:
                seen.append(m)
        return Written(taken, repeated + seen)

    async def _commit(self, messages: Sequence[FarMessage], publish: Publish) -> None:
        if not messages:
            return
        async with self.db.begin() as conn:
            ids = await publish(conn, messages)  # its own errors are not a key seen before
            now = datetime.now(UTC)
            try:
                await conn.execute(self.table.insert(), [
                    {"source": self.source, "msg_key": m.key, "message_id": int(i),
                     "taken_at": now} for m, i in zip(messages, ids, strict=True)])
            except IntegrityError as exc:  # the transaction rolls back, the publish with it
                raise _Known from exc

    async def known(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` the ledger has for this source."""
        t, found = self.table, set()
        async with self.db.connect() as conn:
            for start in range(0, len(keys), LOOKUP_CHUNK):
                chunk = list(keys[start : start + LOOKUP_CHUNK])
                found.update((await conn.execute(
                    select(t.c.msg_key).where(t.c.source == self.source,
                                              t.c.msg_key.in_(chunk)))).scalars())
        return found

    async def prune(self, batch: int = 1000, pause: float = 0.05) -> int:
        """Delete this source's rows older than the retention, ``batch`` rows per short
        transaction, oldest first; returns how many."""
        t, cutoff, total = self.table, datetime.now(UTC) - self.retention, 0
        while True:
            async with self.db.begin() as conn:
                keys = list((await conn.execute(
                    select(t.c.msg_key).where(t.c.source == self.source,
                                              t.c.taken_at < cutoff)
                    .order_by(t.c.taken_at).limit(batch))).scalars())
                if keys:
                    await conn.execute(delete(t).where(t.c.source == self.source,
                                                       t.c.msg_key.in_(keys)))
            total += len(keys)
            if len(keys) < batch:
                return total
            await asyncio.sleep(pause)

    async def rows(self) -> list[Any]:
        """Every row of this source (for tests and tools), oldest first."""
        t = self.table
        async with self.db.connect() as conn:
            return list((await conn.execute(
                select(t).where(t.c.source == self.source).order_by(t.c.taken_at))).all())


__all__ = ["Ledger", "Written"]
