"""The ``SQLMQ`` setting, and the broker's database URL made from Django's own settings.

::

    SQLMQ = {
        "DATABASE": "default",     # the Django database whose transactions messages join
        "URL": None,               # sqlmq's URL for it; None: made from DATABASES
        "TABLE_PREFIX": "sqlmq_",
        "SUBSCRIBERS": [],         # modules of @subscriber handlers beyond each app's
    }                              #   subscribers.py

The URL names the same database as Django's connection, so that a message written on that
connection lands in the tables the broker reads: made from the connection's own settings
(``connections[alias].settings_dict``, which a test run points at its test database), or
given as ``URL`` where the connection needs options sqlmq's drivers take otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from sqlalchemy import URL

from ..schema import DEFAULT_PREFIX

_KEYS = ("DATABASE", "URL", "TABLE_PREFIX", "SUBSCRIBERS")
#: The Django database vendors sqlmq runs on, by the name of sqlmq's URL scheme.
_SCHEMES = {"postgresql": "postgresql", "mysql": "mysql", "sqlite": "sqlite"}


@dataclass(frozen=True)
class Config:
    """The ``SQLMQ`` setting, checked."""

    database: str
    url: str | URL | None
    table_prefix: str
    subscribers: tuple[str, ...]


def config() -> Config:
    """The ``SQLMQ`` setting (every key optional); an unknown key or a database alias Django
    does not know is refused, naming it."""
    from django.conf import settings  # lazy: importing this module needs no settings yet

    given: dict[str, Any] = dict(getattr(settings, "SQLMQ", {}) or {})
    unknown = sorted(set(given) - set(_KEYS))
    if unknown:
        raise ImproperlyConfigured(f"SQLMQ has unknown keys {unknown}; it takes "
                                   f"{', '.join(_KEYS)}")
    database = given.get("DATABASE", "default")
    if database not in settings.DATABASES:
        raise ImproperlyConfigured(f"SQLMQ['DATABASE'] is {database!r}, which is not in "
                                   f"DATABASES ({', '.join(settings.DATABASES)})")
    subscribers = given.get("SUBSCRIBERS", ())
    if isinstance(subscribers, str):
        raise ImproperlyConfigured("SQLMQ['SUBSCRIBERS'] is a list of module paths, got a "
                                   f"string: {subscribers!r}")
    return Config(database, given.get("URL"), given.get("TABLE_PREFIX", DEFAULT_PREFIX),
                  tuple(subscribers))


def database_url(alias: str) -> URL:
    """sqlmq's URL for Django database ``alias``: the same server, database and user."""
    from django.db import connections

    connection = connections[alias]
    scheme = _SCHEMES.get(connection.vendor)
    s = connection.settings_dict
    if scheme is None:
        raise ImproperlyConfigured(
            f"Django database {alias!r} is {connection.vendor} ({s['ENGINE']}); sqlmq runs "
            "on PostgreSQL, MySQL/MariaDB and SQLite")
    if scheme == "sqlite":
        name = str(s["NAME"])
        if name == ":memory:" or "mode=memory" in name:
            raise ImproperlyConfigured(
                f"Django database {alias!r} is an in-memory SQLite database, which only its "
                "own connection sees: sqlmq's worker could not read the messages; use a file")
        return URL.create("sqlite", database=name)
    port = s.get("PORT")
    return URL.create(scheme, username=s.get("USER") or None,
                      password=s.get("PASSWORD") or None, host=s.get("HOST") or None,
                      port=int(port) if port else None, database=s.get("NAME") or None)


__all__ = ["Config", "config", "database_url"]
