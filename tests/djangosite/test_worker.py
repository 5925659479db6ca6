"""``manage.py migrate`` and ``manage.py sqlmq_worker`` as real processes: sqlmq's tables
made by Django's migrations, tasks run with sqlmq's retries, delays and results and read
back through Django's TaskResult, the project's subscribers run, SIGTERM a clean stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from django_tasks import TaskResultStatus
from sqlalchemy import create_engine, inspect

import sqlmq.django
from sqlmq.django.portal import portal

from ..conftest import drop_tables
from .harness import Site
from .shop import tasks
from .shop.views import place_order

MANAGE = str(Path(__file__).with_name("manage.py"))
pytestmark = pytest.mark.slow


def manage(site: Site, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, MANAGE, *args], env=site.env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.fixture
def worker(django_site: Site) -> Iterator[subprocess.Popen[str]]:
    proc = manage(django_site, "sqlmq_worker")
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def finished(result: Any, deadline: float = 60.0) -> Any:
    """``result`` refreshed until it finished (a worker that never runs it fails the test
    at the deadline, with the status it had)."""
    end = time.monotonic() + deadline
    while not result.is_finished and time.monotonic() < end:
        time.sleep(0.05)
        result.refresh()
    assert result.is_finished, result.status
    return result


def stopped(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return out


def test_task_runs_and_its_result_reads_back(worker: subprocess.Popen[str]) -> None:
    result = tasks.calculate_meaning_of_life.enqueue()
    by_id = tasks.get_task_id.enqueue()
    counted = tasks.count_orders.enqueue()  # an async task, on another queue

    finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42
    assert result.attempts == 1 and result.errors == []
    # the start is the worker's clock; SQLite keeps the database's times in milliseconds
    ms = timedelta(milliseconds=1)
    assert result.enqueued_at <= result.started_at + ms <= result.finished_at + 2 * ms
    assert finished(by_id).return_value == by_id.id
    assert finished(counted).return_value == 0
    assert "received SIGTERM: stopping" in stopped(worker)


def test_failing_task_is_retried_then_failed_with_its_error(
        worker: subprocess.Popen[str]) -> None:
    result = finished(tasks.failing_task_value_error.enqueue())

    assert result.status == TaskResultStatus.FAILED and result.attempts == 3  # RETRY's
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert error.traceback.endswith("ValueError: This task failed due to ValueError\n")
    # the first and the last run's ends, as the settles wrote them
    assert result.started_at < result.last_attempted_at
    assert abs(result.last_attempted_at - result.finished_at) < timedelta(seconds=1)
    stopped(worker)


def test_task_succeeds_on_a_retry(worker: subprocess.Popen[str]) -> None:
    result = finished(tasks.succeeds_on_attempt.enqueue(2))

    assert (result.status, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL, 2, 2)
    stopped(worker)


def test_complex_return_value_fails_the_task(worker: subprocess.Popen[str]) -> None:
    result = finished(tasks.complex_return_value.enqueue())

    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError
    stopped(worker)


def test_task_waits_for_run_after(worker: subprocess.Popen[str]) -> None:
    finished(tasks.calculate_meaning_of_life.enqueue())  # the worker is up and taking
    run_after = timezone.now() + timedelta(seconds=3)
    later = tasks.calculate_meaning_of_life.using(run_after=run_after).enqueue()

    later.refresh()
    if timezone.now() < run_after:  # looked before run_after: it cannot have started
        assert later.status == TaskResultStatus.READY and later.attempts == 0
    finished(later)
    assert later.last_attempted_at >= run_after
    stopped(worker)


def test_subscriber_of_an_app_handles_the_view_s_message(
        django_site: Site, worker: subprocess.Popen[str]) -> None:
    order = place_order(12.5, declined=False)
    b = sqlmq.django.broker()
    (message,) = portal.call(lambda: _rows(b, "orders"))

    assert portal.call(lambda: b.result(message["id"], timeout=60)) == {"confirmed": order.id}
    stopped(worker)


async def _rows(broker: Any, queue: str) -> list[Any]:
    from ..conftest import rows

    return await rows(broker, "message", queue=queue)


def test_worker_refuses_an_unknown_queue(django_site: Site) -> None:
    proc = manage(django_site, "sqlmq_worker", "--queue", "reports")
    out, _ = proc.communicate(timeout=60)

    assert proc.returncode != 0
    assert "task backend 'default' has no queue reports: its QUEUES are default, emails" in out


def test_migrate_creates_sqlmq_tables(django_site: Site) -> None:
    prefix = f"m{django_site.prefix}"
    env_site = Site(django_site.kind, django_site.alias, prefix, django_site.url)
    # a fresh record of migrations: sqlmq's migration runs again, for this prefix
    unapplied = manage(env_site, "migrate", "sqlmq", "zero", "--database", django_site.alias)
    assert unapplied.wait(60) == 0, unapplied.communicate()[0]
    try:
        migrated = manage(env_site, "migrate", "--database", django_site.alias)
        out, _ = migrated.communicate(timeout=120)
        assert migrated.returncode == 0, out
        engine = create_engine(django_site.url.replace("mysql://", "mysql+pymysql://"))
        try:
            tables = set(inspect(engine).get_table_names())
        finally:
            engine.dispose()
        assert {f"{prefix}message", f"{prefix}archive"} <= tables
    finally:
        drop_tables(django_site.url, prefix)


def test_task_raising_system_exit_fails_and_the_worker_goes_on(
        worker: subprocess.Popen[str]) -> None:
    exited = finished(tasks.failing_task_system_exit.enqueue())
    after = finished(tasks.calculate_meaning_of_life.enqueue())

    assert exited.status == TaskResultStatus.FAILED
    assert exited.errors[0].exception_class is SystemExit
    assert exited.errors[0].traceback.endswith("SystemExit: This task failed due to SystemExit\n")
    assert after.return_value == 42 and worker.poll() is None
    stopped(worker)
