"""Database time as SQL expressions, one spelling per database.

Leases, schedules and retries are computed from the database clock, never from the
clocks of the hosts that publish or consume: these constructs render "now" and
"now + N seconds" for whichever dialect a statement is compiled for, so a Core insert on a
caller's own connection uses the right one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from .schema import UTCDateTime


# SQLite keeps ISO text with six fractional digits so that values written from Python and
# values computed here compare correctly as text (as in sqlmq/engines/sqlite/statements.py).
def sqlite_now_plus(param: str) -> str:
    return f"(strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',{param}))||'000')"


def pg_now_plus(param: str) -> str:
    return f"(now() + CAST({param} AS DOUBLE PRECISION) * INTERVAL '1 second')"


def mysql_now_plus(param: str) -> str:
    return f"(UTC_TIMESTAMP(6) + INTERVAL CAST({param} * 1000000 AS SIGNED) MICROSECOND)"


class db_now_plus(FunctionElement[Any]):
    """``now + seconds`` on the database clock; ``seconds`` is a SQL expression."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_now_plus"


def _argument(compiler: Any, element: FunctionElement[Any], **kw: Any) -> str:
    (arg,) = list(element.clauses)
    return compiler.process(arg, **kw)


@compiles(db_now_plus, "postgresql")
def _pg(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    return pg_now_plus(_argument(compiler, element, **kw))


@compiles(db_now_plus, "mysql")
@compiles(db_now_plus, "mariadb")
def _my(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    return mysql_now_plus(_argument(compiler, element, **kw))


@compiles(db_now_plus, "sqlite")
def _lite(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    return sqlite_now_plus(_argument(compiler, element, **kw))


def sqlite_seconds_since(moment: str) -> str:
    return f"((julianday('now') - julianday({moment})) * 86400.0)"


def pg_seconds_since(moment: str) -> str:
    return f"CAST(EXTRACT(EPOCH FROM (now() - {moment})) AS DOUBLE PRECISION)"


def mysql_seconds_since(moment: str) -> str:
    return f"(TIMESTAMPDIFF(MICROSECOND, {moment}, UTC_TIMESTAMP(6)) / 1000000.0)"


class db_seconds_since(FunctionElement[Any]):
    """Seconds from ``moment`` (a SQL expression of a time column) to now on the database
    clock: the age of a row, as a chart groups rows by it."""

    type = Float()
    inherit_cache = True
    name = "db_seconds_since"


@compiles(db_seconds_since, "postgresql")
def _pg_since(element: db_seconds_since, compiler: Any, **kw: Any) -> str:
    return pg_seconds_since(_argument(compiler, element, **kw))


@compiles(db_seconds_since, "mysql")
@compiles(db_seconds_since, "mariadb")
def _my_since(element: db_seconds_since, compiler: Any, **kw: Any) -> str:
    return mysql_seconds_since(_argument(compiler, element, **kw))


@compiles(db_seconds_since, "sqlite")
def _lite_since(element: db_seconds_since, compiler: Any, **kw: Any) -> str:
    return sqlite_seconds_since(_argument(compiler, element, **kw))


# A settle's new history with the database's time as its newest entry's "at": the runtime
# appends that entry (the one thing a settle adds) but never reads a clock. An entry that
# already has its time keeps it. The time is written as each database writes a
# lease_expired entry's; NULL stays NULL (the history is kept).
def sqlite_stamped(history: str) -> str:
    return f"json_insert({history}, '$[#-1].at', strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'))"


def pg_stamped(history: str) -> str:
    entries = f"CAST({history} AS JSONB)"
    return (f"jsonb_set({entries}, ARRAY['-1'], jsonb_build_object('at', to_char("
            "now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')) || "
            f"({entries} -> -1))")


# No DATE_FORMAT: MariaDB's settle travels in one packet with %s parameters, where its %Y …
# would be taken for placeholders. A DATETIME(6) as text is "YYYY-MM-DD HH:MM:SS.ffffff".
def mysql_stamped(history: str) -> str:
    return (f"JSON_INSERT({history}, '$[last].at', "
            "REPLACE(CONCAT(UTC_TIMESTAMP(6), '+00:00'), ' ', 'T'))")


class stamped_history(FunctionElement[Any]):
    """A new history (a JSON array, the newest entry last) with the database's time as that
    entry's ``at``, unless it has one; ``history`` is a SQL expression."""

    inherit_cache = True
    name = "stamped_history"


@compiles(stamped_history, "postgresql")
def _pg_stamped(element: stamped_history, compiler: Any, **kw: Any) -> str:
    return pg_stamped(_argument(compiler, element, **kw))


@compiles(stamped_history, "mysql")
@compiles(stamped_history, "mariadb")
def _my_stamped(element: stamped_history, compiler: Any, **kw: Any) -> str:
    return mysql_stamped(_argument(compiler, element, **kw))


@compiles(stamped_history, "sqlite")
def _lite_stamped(element: stamped_history, compiler: Any, **kw: Any) -> str:
    return sqlite_stamped(_argument(compiler, element, **kw))
