"""Database time as SQL expressions, one spelling per database.

Leases, schedules and retries are computed from the database clock, never from the
clocks of the hosts that publish or consume: these constructs render "now" and
"now + N seconds" for whichever dialect a statement is compiled for, so a Core insert on a
caller's own connection uses the right one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from .schema import UTCDateTime


# SQLite keeps ISO text with six fractional digits so that values written from Python and
# values computed here compare correctly as text (as in sqlmq/engines/sql/sqlite.py).
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


def _seconds(compiler: Any, element: db_now_plus, **kw: Any) -> str:
    (arg,) = list(element.clauses)
    return compiler.process(arg, **kw)


@compiles(db_now_plus, "postgresql")
def _pg(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    return pg_now_plus(_seconds(compiler, element, **kw))


@compiles(db_now_plus, "mysql")
@compiles(db_now_plus, "mariadb")
def _my(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    return mysql_now_plus(_seconds(compiler, element, **kw))


@compiles(db_now_plus, "sqlite")
def _lite(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    return sqlite_now_plus(_seconds(compiler, element, **kw))
