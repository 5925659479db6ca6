"""Publishing through Django's own database connection: the outbox.

Inside ``transaction.atomic()`` a message is written on the connection of the database
``SQLMQ["DATABASE"]`` names (its DB-API connection: psycopg 3's, PyMySQL's, sqlite3's), in
the block's transaction, by the broker's one publish path (:mod:`sqlmq.engines.sql.drivers`):
it commits with the block's ORM writes, or rolls back with them.

**Outside an atomic block** Django runs in autocommit mode, where ``Order.objects.create()``
commits at once; a publish there does the same: it runs in a transaction of its own on that
connection, committed before it returns. So code that runs both inside and outside a block
(a model's ``save()``, a signal handler) behaves as the ORM does; to tie a message to other
writes, put both in one ``atomic()`` block (or set ``ATOMIC_REQUESTS``).

**Async views.** Django's connections belong to threads and ``atomic()`` cannot be entered
from a coroutine: an async view puts its transaction in a function it runs with
``sync_to_async``, where it calls :func:`publish`. :func:`apublish` is the ``acreate()``
of messages: it runs :func:`publish` that way, so outside a block it commits at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections, transaction

from ..broker import Broker
from .brokers import broker
from .config import config

T = TypeVar("T")


def publish(queue: str, body: Any, **options: Any) -> int:
    """Publish one message in the current ``atomic()`` block of ``SQLMQ["DATABASE"]``
    (outside one: in a transaction of its own); returns its id. ``options`` are
    :meth:`Broker.publish_sync <sqlmq.publisher.Publisher.publish_sync>`'s (``priority``,
    ``delay``, ``at``, ``headers``, ``dedup_key``, ``channel``, ``expires``)."""
    return _on_django(lambda b, conn: b.publish_sync(queue, body, connection=conn, **options))


def publish_batch(queue: str, bodies: Any, **options: Any) -> list[int]:
    """Publish many messages to one queue at once, as :func:`publish` does one; ids in
    order (see :meth:`Broker.publish_batch_sync
    <sqlmq.publisher.Publisher.publish_batch_sync>`)."""
    return _on_django(lambda b, conn: b.publish_batch_sync(queue, bodies, connection=conn,
                                                           **options))


def publish_topic(topic: str, body: Any, **options: Any) -> dict[str, int]:
    """Publish one message to ``topic``'s consumer groups, as :func:`publish` does (see
    :meth:`Broker.publish_topic_sync <sqlmq.publisher.Publisher.publish_topic_sync>`)."""
    return _on_django(lambda b, conn: b.publish_topic_sync(topic, body, connection=conn,
                                                           **options))


async def apublish(queue: str, body: Any, **options: Any) -> int:
    """:func:`publish` from a coroutine, on the thread Django's connection belongs to."""
    return await sync_to_async(publish)(queue, body, **options)


async def apublish_batch(queue: str, bodies: Any, **options: Any) -> list[int]:
    """:func:`publish_batch` from a coroutine."""
    return await sync_to_async(publish_batch)(queue, bodies, **options)


async def apublish_topic(topic: str, body: Any, **options: Any) -> dict[str, int]:
    """:func:`publish_topic` from a coroutine."""
    return await sync_to_async(publish_topic)(topic, body, **options)


def _on_django(write: Callable[[Broker, Any], T]) -> T:
    alias = config().database
    connection = connections[alias]
    if connection.in_atomic_block:
        # a block already broken by an error would refuse the ORM's next query: the same
        # TransactionManagementError for a publish
        connection.validate_no_broken_transaction()
        return write(broker(), connection.connection)
    with transaction.atomic(using=alias):
        return write(broker(), connection.connection)


__all__ = ["apublish", "apublish_batch", "apublish_topic", "publish", "publish_batch",
           "publish_topic"]
