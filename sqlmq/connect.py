"""Database URLs: what users write (``postgresql://``, ``mysql://``/``mariadb://``,
``sqlite:///path``), checked, with the drivers sqlmq picks. Passwords never leave this module
in clear: :func:`safe_url` is what logs, errors and the CLI show. The SQLAlchemy engines
made from a URL are the engines' business (:func:`sqlmq.engines.create_async`,
:func:`~sqlmq.engines.create_sync`).
"""

from __future__ import annotations

import importlib.util
import re
from typing import TYPE_CHECKING
from urllib.parse import unquote

from sqlalchemy import URL, make_url
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.exc import ArgumentError

from .errors import ConfigurationError

if TYPE_CHECKING:  # imported where used: the Spark workers need none of the asyncio side
    from sqlalchemy.ext.asyncio import AsyncEngine

#: An execution option that asks for a read, not a write: on SQLite sqlmq's connections then
#: begin without the write lock (a plain ``BEGIN``), so a look (a schema check, a count)
#: never waits for the writers; the other databases ignore it.
READ_ONLY = "sqlmq_read_only"

# backend -> (async driver, sync driver)
_DRIVERS = {
    "postgresql": ("asyncpg", "psycopg"),
    "mysql": ("asyncmy", "pymysql"),
    "mariadb": ("asyncmy", "pymysql"),
    "sqlite": ("aiosqlite", "pysqlite"),
}
_ALIASES = {"postgres": "postgresql"}
_MODULES = {"pysqlite": "sqlite3"}


def parse_url(url: str | URL) -> URL:
    """Validate a database URL and return it with sqlmq's async driver."""
    if isinstance(url, str):
        parsed = _parse_text(url)
    else:
        parsed = url
    backend = _ALIASES.get(parsed.get_backend_name(), parsed.get_backend_name())
    if backend not in _DRIVERS:
        raise ConfigurationError(
            f"unsupported database {backend!r} in {safe_url(parsed)}: sqlmq supports "
            "postgresql://, mysql://, mariadb:// and sqlite:///path"
        )
    if backend == "sqlite" and (not parsed.database or parsed.database == ":memory:"):
        raise ConfigurationError(
            "sqlite needs a file path (sqlite:///path/to/file.db): an in-memory database is "
            "private to one connection, so workers and publishers would not share it"
        )
    driver = _DRIVERS[backend][0]
    _require(driver)
    return parsed.set(drivername=f"{backend}+{driver}")


def _parse_text(url: str) -> URL:
    try:
        return _split_userinfo(url) or make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigurationError(
            f"cannot parse database URL {_mask_text(url)!r}: expected postgresql://..., "
            "mysql://..., mariadb://... or sqlite:///path"
        ) from None


def _split_userinfo(url: str) -> URL | None:
    """``user:p@ss@host``: an unencoded ``@`` in the password. SQLAlchemy splits at the
    first ``@`` (host ``ss@host``, and a log line showing half the password); the host is
    what follows the last one, as a person reading the URL means."""
    scheme, sep, rest = url.partition("://")
    authority = rest.split("?", 1)[0]
    if not sep or authority.count("@") < 2:
        return None
    at = authority.rindex("@")
    userinfo, hostpart = rest[:at], rest[at + 1 :]
    user, _, password = userinfo.partition(":")
    parsed = make_url(f"{scheme}://{hostpart}")
    return parsed.set(username=unquote(user) or None, password=unquote(password) or None)


def sync_url(url: URL) -> URL:
    """The same database with sqlmq's synchronous driver (``publish_sync``, Spark)."""
    backend = _ALIASES.get(url.get_backend_name(), url.get_backend_name())
    driver = _DRIVERS[backend][1]
    _require(driver)
    return url.set(drivername=f"{backend}+{driver}")


# driver -> the sqlmq extra that installs it (SQLite's drivers come with sqlmq itself)
_EXTRAS = {"asyncpg": "postgresql", "psycopg": "postgresql", "asyncmy": "mysql",
           "pymysql": "mysql"}


def _require(driver: str) -> None:
    module = _MODULES.get(driver, driver)
    if importlib.util.find_spec(module) is None:
        extra = _EXTRAS.get(driver)
        hint = f"pip install 'sqlmq[{extra}]'" if extra else f"pip install {driver}"
        raise ConfigurationError(
            f"database driver {driver!r} is not installed: {hint}"
        )


# Query parameters that carry a secret, whatever the driver.
_SECRET_PARAMS = ("password", "passwd", "sslpassword", "secret", "token")


def safe_url(url: str | URL | AsyncEngine | SyncEngine) -> str:
    """The URL with its password replaced by ``***``, in the user info and in the query
    (``?password=``); the one form of a URL that logs, errors and the CLI show."""
    if not isinstance(url, str | URL):  # an AsyncEngine or a SyncEngine
        url = url.url
    if isinstance(url, str):
        try:
            url = _split_userinfo(url) or make_url(url)
        except (ArgumentError, ValueError):
            return _mask_text(url)
    secret = {key: "***" for key in url.query
              if any(word in key.lower() for word in _SECRET_PARAMS)}
    if secret:
        url = url.update_query_dict(secret)
    return url.render_as_string(hide_password=True).replace("=%2A%2A%2A", "=***")


def _mask_text(url: str) -> str:
    # An unparseable URL may still carry user:password@ or ?password=; cut them out.
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        url = f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return re.sub(r"((?:pass|secret|token)[^=&]*=)[^&]*", r"\1***", url, flags=re.IGNORECASE)
