"""The topics half of the engine contract (:class:`~.contract.Engine` includes it): a
publish copied into the queue of each consumer group whose pattern matches (see
:mod:`sqlmq.topics`), and the groups themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ...records import NewMessages
from ...topics import TopicGroup

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    from ..sql.drivers import AsyncDriverConnection, SyncDriverConnection


class TopicsContract(Protocol):
    """What ``Broker.publish_topic`` and the consumer groups need of an engine."""

    async def publish_topic(
        self, topic: str, messages: NewMessages,
        executor: AsyncConnection | AsyncSession | AsyncDriverConnection | None = None,
    ) -> dict[str, list[int]]:
        """Publish a copy of ``messages`` (their ``queue`` is ignored) into the queue of
        each consumer group whose pattern matches ``topic``, in one transaction (sqlmq's
        own or ``executor``'s); per queue, the copies' ids in order. No group: nothing."""
        ...

    def publish_topic_sync(
        self, topic: str, messages: NewMessages,
        executor: Connection | Session | SyncDriverConnection | None = None,
    ) -> dict[str, list[int]]:
        """The same, for code without an event loop."""
        ...

    async def join_group(self, pattern: str, group: str) -> TopicGroup:
        """Make the consumer group (if it does not exist yet) and return it."""
        ...

    async def delete_group(self, pattern: str, group: str) -> int | None:
        """Delete the group and the messages waiting or running in its queue (how many);
        None if there was no such group."""
        ...

    async def topic_groups(self) -> list[TopicGroup]:
        """Every consumer group, by pattern then name."""
        ...


__all__ = ["TopicsContract"]
