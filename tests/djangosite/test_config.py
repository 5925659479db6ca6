"""The SQLMQ setting: what is refused, and the URL made from Django's database."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from sqlmq.django.config import config, database_url

from .harness import set_up


@pytest.fixture(autouse=True)
def _django() -> None:
    set_up()


def test_unknown_key_is_refused_naming_it() -> None:
    with override_settings(SQLMQ={"DATABSE": "default"}), \
            pytest.raises(ImproperlyConfigured, match="unknown keys \\['DATABSE'\\]"):
        config()


def test_database_alias_django_does_not_know_is_refused() -> None:
    with override_settings(SQLMQ={"DATABASE": "replica"}), \
            pytest.raises(ImproperlyConfigured, match="'replica', which is not in DATABASES"):
        config()


def test_url_names_the_same_database_server_and_user() -> None:
    url = database_url("postgresql")
    from django.db import connections

    s = connections["postgresql"].settings_dict
    assert (url.get_backend_name(), url.host, url.username, url.database) == (
        "postgresql", s["HOST"], s["USER"], s["NAME"])
    assert database_url("mariadb").get_backend_name() == "mysql"
    assert database_url("default").database == str(connections["default"].settings_dict["NAME"])


def test_system_check_names_a_setting_sqlmq_cannot_use() -> None:
    from django.core import checks

    assert [e for e in checks.run_checks() if e.id.startswith("sqlmq.")] == []
    with override_settings(SQLMQ={"DATABASE": "replica"}):
        (error,) = [e for e in checks.run_checks() if e.id == "sqlmq.E002"]
    assert "'replica', which is not in DATABASES" in error.msg
