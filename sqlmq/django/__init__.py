"""sqlmq in a Django project: messages in the transaction of Django's own database
connection, sqlmq's tables made by ``manage.py migrate``, ``manage.py sqlmq_worker``, and a
backend for Django's Tasks framework.

::

    # settings.py
    INSTALLED_APPS = [..., "sqlmq.django"]
    SQLMQ = {"DATABASE": "default"}   # the Django database sqlmq's tables live in

    # a view
    with transaction.atomic():
        order = Order.objects.create(total=9.5)
        sqlmq.django.publish("orders", {"id": order.id})   # commits or rolls back with it

* :mod:`.config`: the ``SQLMQ`` setting, and the broker's URL made from Django's database;
* :mod:`.brokers`: the process's broker, and the event loop its reads run on;
* :mod:`.outbox`: ``publish`` and its twins, on Django's connection;
* :mod:`.subscribers`: the ``@subscriber`` registry ``sqlmq_worker`` runs;
* :mod:`.tasks`: :class:`~sqlmq.django.tasks.TaskBackend`, Django Tasks on sqlmq.

The task backend is imported on first use (PEP 562): publishing needs no Tasks framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .brokers import broker
from .outbox import (
    apublish,
    apublish_batch,
    apublish_topic,
    publish,
    publish_batch,
    publish_topic,
)
from .subscribers import subscriber

if TYPE_CHECKING:
    from .tasks import TaskBackend


def __getattr__(name: str) -> Any:
    if name == "TaskBackend":
        from .tasks import TaskBackend

        return TaskBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TaskBackend", "apublish", "apublish_batch", "apublish_topic", "broker", "publish",
           "publish_batch", "publish_topic", "subscriber"]
