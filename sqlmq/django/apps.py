"""The Django app: ``INSTALLED_APPS = [..., "sqlmq.django"]``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class SqlmqConfig(AppConfig):
    name = "sqlmq.django"
    # "django" would clash with the apps of django.contrib in the app registry
    label = "sqlmq"
    verbose_name = "sqlmq"

    def ready(self) -> None:
        from django.core import checks
        from django.core.signals import setting_changed

        setting_changed.connect(_settings_changed)
        checks.register(check_settings)


def check_settings(app_configs: Any = None, **_: Any) -> list[Any]:
    """``manage.py check`` (and every command's start) names a ``SQLMQ`` setting sqlmq
    cannot use, instead of the first publish."""
    from django.core import checks
    from django.core.exceptions import ImproperlyConfigured

    from .config import config, database_url

    try:
        c = config()
        if c.url is None:
            database_url(c.database)
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="sqlmq.E002")]
    return []


def _settings_changed(*, setting: str, **_: Any) -> None:
    """A new ``SQLMQ`` or ``DATABASES`` (``override_settings`` in tests) needs a new broker."""
    if setting in ("SQLMQ", "DATABASES"):
        from .brokers import reset

        reset()
