"""@sqlmq.django.subscriber handlers found for the worker, and a worker with nothing to run."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import override_settings

from sqlmq import Broker
from sqlmq.django.config import config
from sqlmq.django.subscribers import discover, register


def test_worker_finds_app_modules_and_the_listed_ones() -> None:
    broker = Broker("memory://")
    with override_settings(SQLMQ={"SUBSCRIBERS": ["tests.djangosite.listed_subscribers"]}):
        discover()
    register(broker)

    found = {s.adapter.name: s.queues for s in broker.subscribers}
    assert found["confirm"] == ("orders",)
    assert found["audit"] == ("audit", "notices")


def test_subscribers_as_one_string_is_refused() -> None:
    with override_settings(SQLMQ={"SUBSCRIBERS": "shop.subscribers"}), \
            pytest.raises(ImproperlyConfigured, match="a list of module paths"):
        config()


def test_worker_with_nothing_to_run_says_so() -> None:
    with override_settings(TASKS={"default": {
            "BACKEND": "django_tasks.backends.immediate.ImmediateBackend"}}), \
            pytest.raises(CommandError, match="nothing to run"):
        call_command("sqlmq_worker", "--no-subscribers", verbosity=0)


def test_worker_refuses_a_backend_that_is_not_sqlmq_s() -> None:
    with override_settings(TASKS={"default": {
            "BACKEND": "django_tasks.backends.immediate.ImmediateBackend"}}), \
            pytest.raises(CommandError, match=r"is ImmediateBackend, not sqlmq\.django"):
        call_command("sqlmq_worker", "--backend", "default", verbosity=0)
