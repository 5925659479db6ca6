"""Topics and consumer groups on the SQL engines, in SQLAlchemy Core (see
:mod:`sqlmq.topics` for the model).

A topic publish reads the groups and writes a copy per matching group in one transaction:
sqlmq's own, or the caller's (the outbox: all copies or none). The read locks the group
rows against deletion (PostgreSQL's ``FOR KEY SHARE``, MySQL's ``LOCK IN SHARE MODE``;
SQLite's writers take turns anyway) until the publish commits: :meth:`delete_group` then
waits for the publishes that saw the group, and a publish after it does not see it, so no
copy lands in a deleted group's queue. A group whose creation commits before a publish
reads the groups gets its copy; one created after does not (it receives messages published
after it was created; the history of other groups is not replayed into it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import Table, delete, insert, literal, select
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from ...records import NewMessages
from ...schema import Schema
from ...sqltime import db_now_plus
from ...topics import TopicGroup, group_queue, queues_for
from .drivers import AsyncDriverConnection, SyncDriverConnection
from .publish import Flow, Step, publish_flow

#: The ids of a topic publish: per queue of a group that received it, the copies' ids.
Fanout = dict[str, list[int]]


def topic_flow(schema: Schema, dialect: Dialect, topic: str, messages: NewMessages,
               wake: Callable[[NewMessages], Step | None]) -> Flow:
    """Read the groups (locked against deletion until the commit), then publish
    ``messages`` into the queue of each group whose pattern matches ``topic``."""
    found = yield _groups(schema.topic_group), None
    fanout: Fanout = {}
    for queue in queues_for(topic, [(r.pattern, r.queue) for r in found.all()]):
        copies = replace(messages, queue=queue)
        fanout[queue] = yield from publish_flow(schema.message, dialect, copies, wake(copies))
    return fanout  # type: ignore[return-value]


@functools.lru_cache(maxsize=64)
def _groups(g: Table) -> Any:
    """Every group's pattern and queue, locked against deletion: built once (see
    :func:`.publish._insert`)."""
    return select(g.c.pattern, g.c.queue).with_for_update(read=True, key_share=True)


class TopicGroups:
    """The topic half of the engine contract for :class:`~.engine.SqlEngine`."""

    db: AsyncEngine
    schema: Schema
    _run_core: Callable[..., Any]
    _run_core_sync: Callable[..., Any]
    _wake_statement: Callable[[NewMessages], Step | None]

    async def publish_topic(
        self, topic: str, messages: NewMessages,
        executor: AsyncConnection | AsyncSession | AsyncDriverConnection | None = None,
    ) -> Fanout:
        return await self._run_core(  # type: ignore[no-any-return]
            lambda d: topic_flow(self.schema, d, topic, messages, self._wake_statement),
            messages, executor)

    def publish_topic_sync(
        self, topic: str, messages: NewMessages,
        executor: Connection | Session | SyncDriverConnection | None = None,
    ) -> Fanout:
        return self._run_core_sync(  # type: ignore[no-any-return]
            lambda d: topic_flow(self.schema, d, topic, messages, self._wake_statement),
            messages, executor)

    async def join_group(self, pattern: str, group: str) -> TopicGroup:
        queue = group_queue(pattern, group)
        found = await self._group(queue)
        if found is not None:
            return found
        g = self.schema.topic_group
        try:
            async with self.db.begin() as conn:
                await conn.execute(insert(g).values(
                    queue=queue, pattern=pattern, group_name=group,
                    created_at=db_now_plus(literal(0.0))))
        except IntegrityError:
            pass  # another process made it meanwhile
        made = await self._group(queue)
        assert made is not None  # groups are only deleted on purpose
        return made

    async def _group(self, queue: str) -> TopicGroup | None:
        g = self.schema.topic_group
        async with self.db.connect() as conn:
            row = (await conn.execute(select(g).where(g.c.queue == queue))).first()
        return None if row is None else _group_of(row)

    async def delete_group(self, pattern: str, group: str) -> int | None:
        queue = group_queue(pattern, group)
        g, m = self.schema.topic_group, self.schema.message
        async with self.db.begin() as conn:
            if (await conn.execute(delete(g).where(g.c.queue == queue))).rowcount == 0:
                return None
            return (await conn.execute(delete(m).where(m.c.queue == queue))).rowcount

    async def topic_groups(self) -> list[TopicGroup]:
        g = self.schema.topic_group
        async with self.db.connect() as conn:
            rows = await conn.execute(select(g).order_by(g.c.pattern, g.c.group_name))
            return [_group_of(r) for r in rows]


def _group_of(row: Any) -> TopicGroup:
    return TopicGroup(row.pattern, row.group_name, row.queue, row.created_at)
