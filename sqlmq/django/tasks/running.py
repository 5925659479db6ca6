"""The worker's side of a task: the sqlmq handler that runs it.

A synchronous handler, so sqlmq runs it on a thread of its pool, where Django's ORM works
as in a view (an async task function runs there through ``Task.call``'s ``async_to_sync``).
Its connections are closed around each run as Django's request handling does, so a
connection the database dropped between two tasks is not reused. A task that raises
fails the run, and sqlmq's retry strategy decides whether it runs again; so does one that
raises ``SystemExit`` or ``KeyboardInterrupt`` (:class:`TaskExit`), which would otherwise
end the worker process and every run in it.
"""

from __future__ import annotations

import traceback
from typing import Any

from django.db import close_old_connections
from django.utils import timezone

from ...message import Message
from .compat import (
    TaskContext,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from .messages import kept, task_error, task_of, worker_ids


class TaskExit(Exception):
    """A task's own ``SystemExit`` or ``KeyboardInterrupt``, as a failed run. Its text ends
    with the original's traceback, whose last line names the original's class (the
    ``TaskError`` read back says ``SystemExit``)."""


def run_task(message: Message) -> dict[str, Any]:
    """Run the task message ``message`` names; what it returned, kept as its result."""
    body = message.body
    task = task_of(body["task"])
    started = timezone.now()
    result = TaskResult(
        task=task, id=str(message.id), status=TaskResultStatus.RUNNING,
        enqueued_at=message.created_at, started_at=started, last_attempted_at=started,
        finished_at=None, args=body["args"], kwargs=body["kwargs"], backend=task.backend,
        errors=[], worker_ids=worker_ids(message.deliveries))
    task_started.send(sender=type(task.get_backend()), task_result=result)
    close_old_connections()
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        value = normalize_json(value)
    except Exception as exc:
        _finished(task, result, TaskResultStatus.FAILED, exc)
        raise
    except BaseException as exc:  # on this thread, the task's own: a real Ctrl-C is the loop's
        _finished(task, result, TaskResultStatus.FAILED, exc)
        trace = "".join(traceback.format_exception(exc)).rstrip()
        raise TaskExit(f"{type(exc).__name__}: {exc}\n\n{trace}") from None
    finally:
        close_old_connections()
    _finished(task, result, TaskResultStatus.SUCCESSFUL)
    return kept(value, started)


def _finished(task: Any, result: TaskResult, status: TaskResultStatus,
              exc: BaseException | None = None) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    if exc is not None:
        result.errors.append(task_error("".join(traceback.format_exception(exc))))
    task_finished.send(sender=type(task.get_backend()), task_result=result)


__all__ = ["TaskExit", "run_task"]
