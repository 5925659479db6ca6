"""The test project's tasks (several after django-tasks' own test tasks)."""

from typing import Any

from django_tasks import TaskContext, task

from .models import Order


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task()
def complex_return_value() -> Any:
    return lambda: True


@task(takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
def succeeds_on_attempt(context: TaskContext, attempt: int) -> int:
    """Fails until its ``attempt``-th run: sqlmq's retries run it again."""
    if context.attempt < attempt:
        raise RuntimeError(f"attempt {context.attempt} of {attempt}")
    return context.attempt


@task(queue_name="emails", priority=10)
async def count_orders() -> int:
    from django.conf import settings

    return await Order.objects.using(settings.SQLMQ["DATABASE"]).acount()


@task()
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")
