"""A task as a sqlmq message, and a message as the task's ``TaskResult``.

The message's body names the task and holds its arguments; the queue is the task's queue
with the backend's ``QUEUE_PREFIX``; the task's priority is the message's. The worker keeps
what the task returned (``results=True``) with the moment it started (the archive keeps
when a run ended, not when it began), and sqlmq's rows hold the rest:

================== =====================================================================
TaskResult          from the message
================== =====================================================================
status              waiting or retrying: READY; running: RUNNING; COMPLETED: SUCCESSFUL;
                    FAILED, EXPIRED or CANCELLED: FAILED
enqueued_at         ``created_at`` (the database's clock)
started_at          the first run's end in the history, or the kept start of a first run
last_attempted_at   the kept start of the successful run, else the last run's end
finished_at         ``archived_at``
errors              the last error, with its traceback (the history keeps earlier ones'
                    first lines, which ``sqlmq show`` and the dashboard list)
worker_ids          one per delivery (``attempts``), named by its number
================== =====================================================================
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.utils.module_loading import import_string

from ...codec import decode_state
from ...lifecycle import State
from ...views import MessageView
from .compat import Task, TaskError, TaskResult, TaskResultStatus

#: The header naming a task message's task: a message without it is not a task's.
TASK_HEADER = "django-task"

_STATUS = {State.PENDING: TaskResultStatus.READY, State.RETRYABLE: TaskResultStatus.READY,
           State.PROCESSING: TaskResultStatus.RUNNING,
           State.COMPLETED: TaskResultStatus.SUCCESSFUL}

# The line of a Python traceback naming the exception: ``module.Class: message``
_RAISED = re.compile(r"^(?P<path>[A-Za-z_][\w.]*)(?::|$)")


def task_body(task: Task, args: Any, kwargs: Any) -> dict[str, Any]:
    return {"task": task.module_path, "args": args, "kwargs": kwargs}


def kept(value: Any, started: datetime) -> dict[str, Any]:
    """What the worker keeps as a task message's result."""
    return {"return_value": value, "started_at": started.isoformat()}


def worker_ids(deliveries: int) -> list[str]:
    """A ``TaskResult``'s ``worker_ids``: one per delivery (sqlmq counts deliveries, and
    keeps no worker's name per run), so that ``attempts`` is the delivery count."""
    return [str(n) for n in range(1, deliveries + 1)]


def task_of(path: str) -> Task:
    """The task ``path`` names; anything else is refused (a message's body names what the
    worker imports and calls)."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise TypeError(f"{path} is not a task (a function decorated with @task)")
    return found


def task_result(view: MessageView, backend: str, queue_name: str) -> TaskResult:
    """The task's ``TaskResult`` as message ``view`` stands."""
    body = view.body()
    task = task_of(body["task"]).using(priority=view.priority, queue_name=queue_name,
                                       backend=backend)
    status = _STATUS.get(view.state, TaskResultStatus.FAILED)  # type: ignore[call-overload]
    stored = decode_state(view.result) if view.result is not None else None
    kept_start = _time(stored.get("started_at")) if isinstance(stored, dict) else None
    ends = [t for t in (_time(e.get("at")) for e in view.history) if t is not None]
    first = ends[0] if ends else kept_start
    last = kept_start or (ends[-1] if ends else None)
    result = TaskResult(
        task=task, id=str(view.id), status=status, enqueued_at=view.created_at,
        started_at=first, last_attempted_at=last, finished_at=view.archived_at,
        args=body["args"], kwargs=body["kwargs"], backend=backend,
        errors=[] if not view.error or status == TaskResultStatus.SUCCESSFUL else
        [task_error(view.error)],
        worker_ids=worker_ids(view.deliveries))
    if status == TaskResultStatus.SUCCESSFUL and isinstance(stored, dict):
        object.__setattr__(result, "_return_value", stored.get("return_value"))
    return result


def task_error(error: str) -> TaskError:
    """sqlmq's error text (a line naming the error, then the traceback) as a ``TaskError``:
    the class's path from the traceback's last line, which Python writes as ``module.Class``
    (``builtins.`` left out)."""
    _, _, trace = error.partition("\n\n")
    trace = trace or error
    path = "builtins.Exception"
    for line in reversed(trace.splitlines()):
        found = _RAISED.match(line)
        if found:
            path = found["path"] if "." in found["path"] else f"builtins.{found['path']}"
            break
    return TaskError(exception_class_path=path, traceback=trace.rstrip("\n") + "\n")


def _time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


__all__ = ["TASK_HEADER", "kept", "task_body", "task_error", "task_of", "task_result",
           "worker_ids"]
