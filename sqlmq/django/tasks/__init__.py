"""Django's Tasks framework on sqlmq.

* :mod:`.compat`: ``django.tasks`` (Django 6) or the ``django-tasks`` backport;
* :mod:`.backend`: :class:`TaskBackend`, which enqueues and reads results;
* :mod:`.messages`: a task as a message, and a message as a ``TaskResult``;
* :mod:`.running`: the worker's handler that runs a task.
"""

from __future__ import annotations

from .backend import TaskBackend

__all__ = ["TaskBackend"]
