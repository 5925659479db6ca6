"""The test project in this test process: its databases made once per process (a fresh
name on PostgreSQL and MariaDB, a file on SQLite) and dropped at exit, Django set up on
them, and per test sqlmq's tables with the test's prefix."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import pymysql
from sqlalchemy import make_url

from ..conftest import MYSQL_URL, PG_URL, drop_tables

#: The Django database of each engine of the test suite.
ALIASES = {"sqlite": "default", "postgresql": "postgresql", "mariadb": "mariadb"}
_ready = False


def _server(kind: str, sql: str) -> None:
    if kind == "postgresql":
        url = make_url(PG_URL)
        with psycopg.connect(host=url.host, port=url.port or 5432, user=url.username,
                             password=url.password, dbname=url.database,
                             autocommit=True) as conn:
            conn.execute(sql)
    else:
        url = make_url(MYSQL_URL)
        conn = pymysql.connect(host=url.host, port=url.port or 3306, user=url.username,
                               password=url.password or "", autocommit=True)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql)
        finally:
            conn.close()


def set_up() -> None:
    """Make this process's databases, set Django up on them and migrate them (once)."""
    global _ready
    if _ready:
        return
    name = f"sqlmq_dj_{uuid.uuid4().hex[:12]}"
    folder = tempfile.mkdtemp(prefix="sqlmq-django-")
    os.environ.update(SQLMQ_DJANGO_NAME=name, SQLMQ_DJANGO_SQLITE=f"{folder}/site.db",
                      DJANGO_SETTINGS_MODULE="tests.djangosite.settings")
    for kind in ("postgresql", "mariadb"):
        _server(kind, f"CREATE DATABASE {name}")
    atexit.register(_tear_down, name, folder)
    import django
    from django.core.management import call_command

    django.setup()
    for alias in ALIASES.values():
        call_command("migrate", database=alias, verbosity=0)
    _ready = True


def _tear_down(name: str, folder: str) -> None:
    from django.db import connections

    connections.close_all()
    for kind, sql in (("postgresql", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                      ("mariadb", f"DROP DATABASE IF EXISTS {name}")):
        try:
            _server(kind, sql)
        except Exception as exc:  # at exit: say what is left behind, drop the rest
            print(f"tests.djangosite: {kind} database {name} not dropped: {exc}",
                  file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Site:
    """The project on one database, with sqlmq's tables of one test."""

    kind: str
    alias: str
    prefix: str
    url: str

    def env(self) -> dict[str, str]:
        """A ``manage.py`` subprocess's environment, for the same database and tables."""
        return {**os.environ, "SQLMQ_DJANGO_DATABASE": self.alias,
                "SQLMQ_DJANGO_PREFIX": self.prefix}


@contextmanager
def site(kind: str, prefix: str) -> Iterator[Site]:
    """The project on database ``kind`` with sqlmq's tables of ``prefix``; the orders and
    those tables gone afterwards."""
    set_up()
    from django.test import override_settings

    import sqlmq.django
    from sqlmq.django.config import database_url
    from sqlmq.django.portal import portal

    from .shop.models import Order

    alias = ALIASES[kind]
    url = database_url(alias).render_as_string(hide_password=False)
    with override_settings(SQLMQ={"DATABASE": alias, "TABLE_PREFIX": prefix}):
        try:
            portal.call(sqlmq.django.broker().migrate)
            yield Site(kind, alias, prefix, url)
        finally:
            Order.objects.using(alias).all().delete()
    drop_tables(url, prefix)
