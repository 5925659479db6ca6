"""The broker's publishing half: ``publish``, ``publish_batch``, their topic counterparts
(:mod:`sqlmq.topics`) and their synchronous twins.

Every publish is validated and encoded first (:func:`sqlmq.publishing.prepare`), then
written by the engine, on sqlmq's own connections or in the caller's transaction
(``connection=``: the outbox). A single due publish with nobody else's transaction may be
handed straight to an idle subscriber of this process (:mod:`sqlmq.handover`). Every
publish goes through the middleware's ``publish`` hooks, when there are any
(:mod:`sqlmq.middleware`), between the validation and the write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from .engines.contract import Engine
from .errors import ConfigurationError, PublishError
from .handover import hand_over, idle_runtime
from .middleware import Hooks, PublishBatch
from .publishing import check_executor, prepare
from .records import NewMessages
from .runtime import SubscriberRuntime
from .topics import TOPIC_HEADER, check_topic
from .wakeups import Wakeups

if TYPE_CHECKING:
    import sqlite3

    import aiosqlite
    import asyncmy
    import asyncpg
    import psycopg
    import pymysql

#: When a message expires: seconds or a timedelta from the database's now, or a moment.
Expiry = float | timedelta | datetime
#: The caller's transaction an ``await publish…(connection=)`` joins: SQLAlchemy's, or a
#: driver's own connection (see :func:`sqlmq.publishing.check_executor`).
AsyncTransaction: TypeAlias = (
    "AsyncConnection | AsyncSession | asyncpg.Connection | psycopg.AsyncConnection[Any]"
    " | aiosqlite.Connection | asyncmy.Connection")
#: The same for ``publish…_sync(connection=)``.
SyncTransaction: TypeAlias = (
    "Connection | Session | psycopg.Connection[Any] | sqlite3.Connection"
    " | pymysql.connections.Connection")


class Publisher:
    """Publishing, for :class:`sqlmq.Broker` (which sets these attributes)."""

    max_payload_bytes: int
    _engine: Engine
    _runtimes: list[SubscriberRuntime]
    _wakeups: Wakeups
    _hooks: Hooks

    async def publish(
        self, queue: str, body: Any, *, headers: Mapping[str, str] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        priority: int = 0, expires: Expiry | None = None, dedup_key: str | None = None,
        channel: str | None = None, connection: AsyncTransaction | None = None,
    ) -> int:
        """Publish one message; returns its id. With ``connection`` (the caller's
        transaction: SQLAlchemy's ``AsyncConnection`` or ``AsyncSession``, or an asyncpg,
        psycopg ``AsyncConnection``, aiosqlite or asyncmy connection) it commits or rolls
        back with the caller's transaction. A higher ``priority`` (-32768..32767) goes first.
        A message not started by ``expires`` (seconds or a timedelta from the database's
        now, or a moment) is archived EXPIRED instead of running. With ``dedup_key``, while
        a message with that key waits or runs in ``queue`` nothing is written: the result,
        a :class:`~sqlmq.Published`, is that message's id with ``duplicate`` true. With
        ``channel``, it is taken under that channel's limits (see :mod:`sqlmq.channels`);
        one that would exceed its ``max_size`` is refused with :class:`~sqlmq.ChannelFull`."""
        _one_mapping(headers)
        (msg_id,) = await self.publish_batch(
            queue, [body], headers=headers, delay=delay, at=at, priority=priority,
            expires=expires, dedup_keys=None if dedup_key is None else [dedup_key],
            channel=channel, connection=connection)
        return msg_id

    async def publish_batch(
        self, queue: str, bodies: Iterable[Any], *,
        headers: Mapping[str, str] | Sequence[Mapping[str, str]] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        priority: int = 0, expires: Expiry | None = None,
        dedup_keys: Sequence[str | None] | None = None, channel: str | None = None,
        connection: AsyncTransaction | None = None,
    ) -> list[int]:
        """Publish many messages (one priority, expiry and channel) to one queue at once;
        ids in order. ``headers``: one mapping for every message, or a sequence of them,
        one per body. ``dedup_keys``: a key (or None) per body; a key met twice in the
        batch is one message."""
        messages = self._prepare(queue, bodies, headers, delay, at, priority, expires,
                                 dedup_keys, channel)
        if not messages:
            return []
        executor = check_executor(connection, asynchronous=True)
        if self._hooks.publish:
            batch = PublishBatch(messages, connection=connection)
            with self._hooks.around_publish(batch):
                ids = batch.ids = await self._write(queue, messages, executor)
            return ids
        return await self._write(queue, messages, executor)

    async def _write(self, queue: str, messages: NewMessages, executor: Any) -> list[int]:
        if executor is None and self._engine.hands_over and len(messages) == 1 \
                and messages.at is None and not messages.core_only:
            direct = idle_runtime(self._runtimes, self._wakeups, messages[0])
            if direct is not None:
                handed = await hand_over(self._engine, self._wakeups, direct, messages[0])
                if handed is not None:
                    return [handed]  # else its queue is paused: published the usual way
        ids = await self._engine.publish(messages, executor)
        self._wakeups.wake_when_visible(queue, executor)
        return ids

    def publish_sync(
        self, queue: str, body: Any, *, headers: Mapping[str, str] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        priority: int = 0, expires: Expiry | None = None, dedup_key: str | None = None,
        channel: str | None = None, connection: SyncTransaction | None = None,
    ) -> int:
        """The synchronous twin of :meth:`publish`, for code without an event loop;
        ``connection``: SQLAlchemy's ``Connection`` or ``Session``, or a psycopg, sqlite3 or
        PyMySQL connection."""
        _one_mapping(headers)
        (msg_id,) = self.publish_batch_sync(
            queue, [body], headers=headers, delay=delay, at=at, priority=priority,
            expires=expires, dedup_keys=None if dedup_key is None else [dedup_key],
            channel=channel, connection=connection)
        return msg_id

    def publish_batch_sync(
        self, queue: str, bodies: Iterable[Any], *,
        headers: Mapping[str, str] | Sequence[Mapping[str, str]] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        priority: int = 0, expires: Expiry | None = None,
        dedup_keys: Sequence[str | None] | None = None, channel: str | None = None,
        connection: SyncTransaction | None = None,
    ) -> list[int]:
        """The synchronous twin of :meth:`publish_batch`."""
        messages = self._prepare(queue, bodies, headers, delay, at, priority, expires,
                                 dedup_keys, channel)
        if not messages:
            return []
        executor = check_executor(connection, asynchronous=False)
        if self._hooks.publish:
            batch = PublishBatch(messages, connection=connection)
            with self._hooks.around_publish(batch):
                ids = batch.ids = self._engine.publish_sync(messages, executor)
        else:
            ids = self._engine.publish_sync(messages, executor)
        self._wakeups.wake_when_visible(queue, executor)
        return ids

    async def publish_topic(
        self, topic: str, body: Any, *, headers: Mapping[str, str] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        priority: int = 0, expires: Expiry | None = None, dedup_key: str | None = None,
        connection: AsyncTransaction | None = None,
    ) -> dict[str, int]:
        """Publish one message to ``topic``: a copy into the queue of every consumer group
        whose pattern matches it (see :mod:`sqlmq.topics`), all in one transaction (the
        caller's, with ``connection``). Returns each copy's id by its group's queue; no
        group, no copy: ``{}``. Each copy carries the header ``topic``. The options are
        :meth:`publish`'s, per copy (``dedup_key`` is checked in each group's queue)."""
        fanout = await self.publish_topic_batch(
            topic, [body], headers=headers, delay=delay, at=at, priority=priority,
            expires=expires, dedup_keys=None if dedup_key is None else [dedup_key],
            connection=connection)
        return {queue: ids[0] for queue, ids in fanout.items()}

    async def publish_topic_batch(
        self, topic: str, bodies: Iterable[Any], *, headers: Mapping[str, str] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        priority: int = 0, expires: Expiry | None = None,
        dedup_keys: Sequence[str | None] | None = None,
        connection: AsyncTransaction | None = None,
    ) -> dict[str, list[int]]:
        """Publish many messages to ``topic`` at once: per group's queue, the ids of its
        copies in order."""
        messages = self._prepare_topic(topic, bodies, headers, delay, at, priority, expires,
                                       dedup_keys)
        if not messages:
            return {}
        executor = check_executor(connection, asynchronous=True)
        if self._hooks.publish:
            batch = PublishBatch(messages, topic=topic, connection=connection)
            with self._hooks.around_publish(batch):
                fanout = await self._engine.publish_topic(topic, messages, executor)
                batch.ids = [i for ids in fanout.values() for i in ids]
        else:
            fanout = await self._engine.publish_topic(topic, messages, executor)
        for queue in fanout:
            self._wakeups.wake_when_visible(queue, executor)
        return fanout

    def publish_topic_sync(
        self, topic: str, body: Any, *, headers: Mapping[str, str] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        priority: int = 0, expires: Expiry | None = None, dedup_key: str | None = None,
        connection: SyncTransaction | None = None,
    ) -> dict[str, int]:
        """The synchronous twin of :meth:`publish_topic`."""
        fanout = self.publish_topic_batch_sync(
            topic, [body], headers=headers, delay=delay, at=at, priority=priority,
            expires=expires, dedup_keys=None if dedup_key is None else [dedup_key],
            connection=connection)
        return {queue: ids[0] for queue, ids in fanout.items()}

    def publish_topic_batch_sync(
        self, topic: str, bodies: Iterable[Any], *, headers: Mapping[str, str] | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        priority: int = 0, expires: Expiry | None = None,
        dedup_keys: Sequence[str | None] | None = None,
        connection: SyncTransaction | None = None,
    ) -> dict[str, list[int]]:
        """The synchronous twin of :meth:`publish_topic_batch`."""
        messages = self._prepare_topic(topic, bodies, headers, delay, at, priority, expires,
                                       dedup_keys)
        if not messages:
            return {}
        executor = check_executor(connection, asynchronous=False)
        if self._hooks.publish:
            batch = PublishBatch(messages, topic=topic, connection=connection)
            with self._hooks.around_publish(batch):
                fanout = self._engine.publish_topic_sync(topic, messages, executor)
                batch.ids = [i for ids in fanout.values() for i in ids]
        else:
            fanout = self._engine.publish_topic_sync(topic, messages, executor)
        for queue in fanout:
            self._wakeups.wake_when_visible(queue, executor)
        return fanout

    def _prepare_topic(self, topic: str, bodies: Iterable[Any],
                       headers: Mapping[str, str] | None, delay: float | timedelta | None,
                       at: datetime | None, priority: int, expires: Expiry | None,
                       dedup_keys: Sequence[str | None] | None) -> NewMessages:
        try:
            check_topic(topic)
        except ConfigurationError as exc:
            raise PublishError(str(exc)) from None
        _one_mapping(headers)
        headers = {**(headers or {}), TOPIC_HEADER: topic}
        return self._prepare(topic, bodies, headers, delay, at, priority, expires, dedup_keys)

    def _prepare(self, queue: str, bodies: Iterable[Any],
                 headers: Mapping[str, str] | Sequence[Mapping[str, str]] | None,
                 delay: float | timedelta | None, at: datetime | None, priority: int,
                 expires: Expiry | None, dedup_keys: Sequence[str | None] | None,
                 channel: str | None = None) -> NewMessages:
        each = None  # one mapping per message (a batch's), else prepare() names the error
        if isinstance(headers, Sequence) and not isinstance(headers, str | bytes):
            headers, each = None, headers
        return prepare(queue, bodies, headers=headers, delay=delay, at=at,
                       max_payload_bytes=self.max_payload_bytes, priority=priority,
                       expires=expires, dedup_keys=dedup_keys, channel=channel,
                       headers_each=each)


def _one_mapping(headers: object) -> None:
    """Where one mapping serves every message (a single publish, a topic's copies), a
    sequence is refused as any other non-mapping: only a batch takes headers per message."""
    if headers is not None and not isinstance(headers, Mapping):
        raise PublishError(f"headers must be a mapping of str to str, got "
                           f"{type(headers).__name__}")
