"""Django's Tasks framework: ``django.tasks`` from Django 6 on, else the ``django-tasks``
backport (``django_tasks``), whose API Django 6 took over."""

from __future__ import annotations

import django

if django.VERSION >= (6, 0):
    from django.dispatch import Signal
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks import signals as _signals
    from django.tasks import utils as _utils
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist

    # the names the backport has; Django's own differ between its versions
    normalize_json = getattr(_utils, "normalize_json", None) or _utils.json_normalize
    task_enqueued = _signals.task_enqueued
    task_started = getattr(_signals, "task_started", None) or Signal()
    task_finished = _signals.task_finished
else:
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

__all__ = [
    "BaseTaskBackend",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
