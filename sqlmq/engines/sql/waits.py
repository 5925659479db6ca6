"""What a live message waits on (:mod:`sqlmq.waits`) as one SQL expression over its row,
so that a queue's live messages are filtered and counted by it in the database.

The one part that differs between databases is the ending of the row's last delivery (the
``ended`` of the history's last entry: ``deferred`` after a defer), read from its JSON;
each database has its own spelling, as :mod:`sqlmq.sqltime` has for time.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, Table, and_, case, func, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement

from ...lifecycle import State
from ...sqltime import db_now_plus
from ...waits import Wait


class last_ending(FunctionElement[Any]):
    """The ``ended`` of the last entry of a history (a JSON array; NULL: none)."""

    type = String()
    inherit_cache = True
    name = "last_ending"


def _history(compiler: Any, element: last_ending, **kw: Any) -> str:
    (arg,) = list(element.clauses)
    return compiler.process(arg, **kw)


@compiles(last_ending, "postgresql")
def _pg(element: last_ending, compiler: Any, **kw: Any) -> str:
    return f"(CAST({_history(compiler, element, **kw)} AS JSONB) -> -1 ->> 'ended')"


# Not '$[last]': MariaDB 10.11 reads it as NULL once the expression feeds a GROUP BY or an
# ORDER BY (a CASE over it grouped every deferred message as delayed).
@compiles(last_ending, "mysql")
@compiles(last_ending, "mariadb")
def _my(element: last_ending, compiler: Any, **kw: Any) -> str:
    history = _history(compiler, element, **kw)
    return (f"JSON_UNQUOTE(JSON_EXTRACT({history}, "
            f"CONCAT('$[', JSON_LENGTH({history}) - 1, '].ended')))")


@compiles(last_ending, "sqlite")
def _lite(element: last_ending, compiler: Any, **kw: Any) -> str:
    return f"json_extract({_history(compiler, element, **kw)}, '$[#-1].ended')"


def waits_of(m: Table) -> ColumnElement[str]:
    """What each row of message table ``m`` waits on, a :class:`~sqlmq.waits.Wait` value:
    the rules of :mod:`sqlmq.waits`, in their order."""
    c = m.c
    later = func.coalesce(c.next_attempt_at, c.channel_due_at) > db_now_plus(literal(0.0))
    deferred = and_(later, last_ending(c.history) == "deferred")
    return case(
        (c.cancel_requested == 1, Wait.CANCELLING.value),
        (c.state == State.PROCESSING.value, Wait.RUNNING.value),
        (c.state == State.WAITING.value, Wait.STEPS.value),
        (and_(deferred, c.waits_for.is_not(None)), Wait.SIGNAL.value),
        (deferred, Wait.DEFERRED.value),
        (later, Wait.DELAYED.value),
        else_=Wait.READY.value)


__all__ = ["last_ending", "waits_of"]
