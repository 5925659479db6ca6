"""``TASKS = {"default": {"BACKEND": "sqlmq.django.TaskBackend"}}``: Django's tasks as sqlmq
messages.

``enqueue`` publishes the task in the current ``atomic()`` block (:mod:`..outbox`): a task
enqueued with an order runs only if the order commits. ``manage.py sqlmq_worker`` runs it
(:mod:`.running`), with sqlmq's retries, priorities, delays and results; ``get_result``
reads the message back (:mod:`.messages`).

``OPTIONS``:

* ``QUEUE_PREFIX`` (``"tasks."``): a task queue's sqlmq queue is this prefix and its name;
* ``RETRY``: the subscriber's retry strategy (a :class:`sqlmq.Retry`; sqlmq's default,
  five attempts with exponential back-off, when not set; ``Retry.none()`` for none);
* ``WORKERS`` (8) and ``LEASE`` (30 s): the worker's subscriber's, for all the queues.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

from ..brokers import broker
from ..outbox import publish
from ..portal import portal
from .compat import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from .messages import TASK_HEADER, task_body, task_result

_OPTIONS = ("QUEUE_PREFIX", "RETRY", "WORKERS", "LEASE")


class TaskBackend(BaseTaskBackend):
    """Django's Tasks on sqlmq: enqueued in the caller's transaction, run by
    ``manage.py sqlmq_worker``."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True
    #: The sqlmq queue prefix of task queues unless ``OPTIONS["QUEUE_PREFIX"]`` says.
    QUEUE_PREFIX: ClassVar[str] = "tasks."

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(_OPTIONS))
        if unknown:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS'] has unknown keys "
                                       f"{unknown}; it takes {', '.join(_OPTIONS)}")
        retry = self.options.get("RETRY")
        if retry is not None and not callable(retry):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['RETRY'] is a sqlmq.Retry (such as "
                f"Retry.exponential(max_attempts=3)), got {retry!r}")
        self.queue_prefix: str = self.options.get("QUEUE_PREFIX", self.QUEUE_PREFIX)

    def queue(self, queue_name: str) -> str:
        """The sqlmq queue of task queue ``queue_name``."""
        return f"{self.queue_prefix}{queue_name}"

    def subscription(self) -> dict[str, Any]:
        """The worker's subscriber options for this backend's queues."""
        options: dict[str, Any] = {"results": True}
        if "RETRY" in self.options:
            options["retry"] = self.options["RETRY"]
        if "WORKERS" in self.options:
            options["workers"] = self.options["WORKERS"]
        if "LEASE" in self.options:
            options["lease"] = self.options["LEASE"]
        return options

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        result = TaskResult(
            task=task, id="", status=TaskResultStatus.READY, enqueued_at=timezone.now(),
            started_at=None, last_attempted_at=None, finished_at=None, args=args,
            kwargs=kwargs, backend=self.alias, errors=[], worker_ids=[])
        # TaskResult normalised the arguments to JSON's types: that is what the task gets
        msg_id = publish(self.queue(task.queue_name), task_body(task, result.args, result.kwargs),
                         priority=task.priority, at=task.run_after,
                         headers={TASK_HEADER: task.module_path})
        object.__setattr__(result, "id", str(msg_id))
        task_enqueued.send(type(self), task_result=result)
        return result

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        from django.apps import apps

        if not apps.is_installed("sqlmq.django"):
            yield checks.Error(
                f"task backend {self.alias!r} is sqlmq's, and sqlmq.django is not installed",
                hint="add 'sqlmq.django' to INSTALLED_APPS: its migration creates sqlmq's "
                     "tables, and manage.py sqlmq_worker runs the tasks",
                id="sqlmq.E001")

    def get_result(self, result_id: str) -> TaskResult:
        msg_id = _message_id(result_id)
        b = broker()
        return self._result(result_id, portal.call(lambda: b.insights().message(msg_id)))

    async def aget_result(self, result_id: str) -> TaskResult:
        msg_id = _message_id(result_id)
        b = broker()
        return self._result(result_id,
                            await portal.acall(lambda: b.insights().message(msg_id)))

    def _result(self, result_id: str, view: Any) -> TaskResult:
        if view is None or TASK_HEADER not in view.headers or \
                not view.queue.startswith(self.queue_prefix):
            raise TaskResultDoesNotExist(result_id)
        return task_result(view, self.alias, view.queue[len(self.queue_prefix):])


def _message_id(result_id: str) -> int:
    try:
        return int(result_id)
    except (TypeError, ValueError):
        raise TaskResultDoesNotExist(result_id) from None


def sqlmq_backends(aliases: Iterable[str] | None = None) -> list[TaskBackend]:
    """The task backends of ``TASKS`` that are sqlmq's (those named in ``aliases``; each
    of them must be)."""
    from django.conf import settings

    from . import compat

    tasks: dict[str, Any] = getattr(settings, "TASKS", {}) or {}
    backends = compat.task_backends
    if aliases is None:
        return [backends[a] for a, p in tasks.items()
                if issubclass(import_string(p["BACKEND"]), TaskBackend)]
    found = []
    for alias in aliases:
        if alias not in tasks:
            raise ImproperlyConfigured(f"no task backend {alias!r} in TASKS ({', '.join(tasks)})")
        backend = backends[alias]
        if not isinstance(backend, TaskBackend):
            raise ImproperlyConfigured(f"task backend {alias!r} is {type(backend).__name__}, "
                                   "not sqlmq.django.TaskBackend")
        found.append(backend)
    return found


__all__ = ["TaskBackend", "sqlmq_backends"]
