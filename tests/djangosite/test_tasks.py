"""sqlmq.django.TaskBackend without a worker: django-tasks' own expectations of a backend
that stores results (its database backend's tests, where they apply), and enqueueing in
the caller's transaction."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import Client, override_settings
from django.utils import timezone
from django_tasks import TaskResultStatus, default_task_backend, task_backends
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
from django_tasks.signals import task_enqueued

import sqlmq.django
from sqlmq.django.portal import portal
from sqlmq.django.tasks import TaskBackend

from ..conftest import rows
from .harness import Site
from .shop import tasks


def task_messages() -> list[Any]:
    b = sqlmq.django.broker()
    return portal.call(lambda: rows(b, "message"))


def test_using_sqlmq_backend(django_site: Site) -> None:
    assert isinstance(task_backends["default"], TaskBackend)
    assert default_task_backend.alias == "default"


@pytest.mark.parametrize("task", [tasks.noop_task, tasks.noop_task_async])
def test_enqueue_task(django_site: Site, task: Any) -> None:
    received = []
    task_enqueued.connect(lambda sender, task_result, **_: received.append(task_result),
                          weak=False, dispatch_uid="test_enqueue_task")
    try:
        result = task.enqueue(1, two=3)
    finally:
        task_enqueued.disconnect(dispatch_uid="test_enqueue_task")

    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None,) * 3
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert (result.task, result.args, result.kwargs, result.attempts) == (task, [1],
                                                                          {"two": 3}, 0)
    assert received == [result]
    (message,) = task_messages()
    assert message["queue"] == "tasks.default" and message["id"] == int(result.id)
    assert json.loads(message["payload"]) == {"task": task.module_path, "args": [1],
                                              "kwargs": {"two": 3}}


async def test_enqueue_task_async(django_site: Site) -> None:
    result = await tasks.noop_task_async.aenqueue()

    assert result.status == TaskResultStatus.READY and (result.args, result.kwargs) == ([], {})
    fetched = await default_task_backend.aget_result(result.id)
    assert (fetched.id, fetched.status, fetched.task) == (result.id, result.status, result.task)


def test_get_result(django_site: Site) -> None:
    result = default_task_backend.enqueue(tasks.noop_task, [], {})

    fetched = default_task_backend.get_result(result.id)

    assert (fetched.id, fetched.task, fetched.status, fetched.args, fetched.kwargs,
            fetched.errors, fetched.attempts) == (result.id, result.task, result.status,
                                                  [], {}, [], 0)
    assert abs(fetched.enqueued_at - result.enqueued_at) < timedelta(seconds=5)
    assert tasks.noop_task.get_result(result.id).id == result.id


def test_get_missing_or_foreign_result(django_site: Site) -> None:
    not_a_task = sqlmq.django.publish("orders", {"id": 1})
    for result_id in ["123456", "not-a-number", str(not_a_task)]:
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


async def test_async_get_missing_result(django_site: Site) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        await default_task_backend.aget_result("123456")


def test_enqueue_is_rolled_back_with_the_block(django_site: Site) -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using=django_site.alias):
        result = tasks.calculate_meaning_of_life.enqueue()
        raise RuntimeError("abandoned")

    assert task_messages() == []
    with pytest.raises(TaskResultDoesNotExist):
        result.refresh()


def test_priority_queue_and_run_after_become_the_message_s(django_site: Site) -> None:
    later = timezone.now() + timedelta(hours=1)
    result = tasks.noop_task.using(priority=-7, queue_name="emails", run_after=later).enqueue()

    (message,) = task_messages()
    assert (message["queue"], message["priority"]) == ("tasks.emails", -7)
    assert abs(message["next_attempt_at"] - later) < timedelta(seconds=1)
    assert default_task_backend.get_result(result.id).task.queue_name == "emails"


def test_unknown_queue_is_refused_naming_it(django_site: Site) -> None:
    with pytest.raises(InvalidTaskError, match="Queue 'unknown_queue' is not valid"):
        tasks.noop_task.using(queue_name="unknown_queue").enqueue()
    assert task_messages() == []


def test_run_after_must_be_aware(django_site: Site) -> None:
    with pytest.raises(InvalidTaskError, match="aware"):
        tasks.noop_task.using(run_after=timezone.now().replace(tzinfo=None)).enqueue()


def test_unknown_option_is_refused_naming_it() -> None:
    from django.core.exceptions import ImproperlyConfigured

    with override_settings(TASKS={"default": {"BACKEND": "sqlmq.django.TaskBackend",
                                              "OPTIONS": {"RETRIES": 3}}}), \
            pytest.raises(ImproperlyConfigured, match="unknown keys \\['RETRIES'\\]"):
        task_backends["default"]


@pytest.mark.parametrize("path", ["/meaning", "/meaning/async"])
def test_meaning_of_life_view(django_site: Site, path: str) -> None:
    data = Client().get(path).json()

    assert (data["result"], data["status"]) == (None, TaskResultStatus.READY)
    assert default_task_backend.get_result(data["result_id"]).status == TaskResultStatus.READY


def test_get_result_from_different_request(django_site: Site) -> None:
    result_id = Client().get("/meaning").json()["result_id"]

    assert Client().get(f"/results/{result_id}").json() == {
        "result_id": result_id, "result": None, "status": TaskResultStatus.READY}


def test_check_passes_with_the_app_and_names_it_without(django_site: Site) -> None:
    assert list(default_task_backend.check()) == []
    with override_settings(INSTALLED_APPS=["django_tasks", "tests.djangosite.shop"]):
        (error,) = default_task_backend.check()
    assert error.id == "sqlmq.E001" and "'sqlmq.django' to INSTALLED_APPS" in error.hint


def test_retry_that_is_not_a_strategy_is_refused() -> None:
    from django.core.exceptions import ImproperlyConfigured

    with override_settings(TASKS={"default": {"BACKEND": "sqlmq.django.TaskBackend",
                                              "OPTIONS": {"RETRY": 3}}}), \
            pytest.raises(ImproperlyConfigured, match=r"\['RETRY'\] is a sqlmq\.Retry"):
        task_backends["default"]


def test_enqueued_task_shows_in_the_insights_the_dashboard_reads(django_site: Site) -> None:
    result = tasks.noop_task.using(queue_name="emails").enqueue()

    b = sqlmq.django.broker()
    (queue,) = portal.call(lambda: b.insights().queues())
    message = portal.call(lambda: b.insights().message(int(result.id)))
    assert queue.queue == "tasks.emails" and queue.stats.pending == 1
    assert message.headers["django-task"] == tasks.noop_task.module_path
