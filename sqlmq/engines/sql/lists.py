"""A Python list as one statement parameter, on every database.

An expanding ``IN`` renders one placeholder per item at every execution: with the 500
ids or channel names of a channel acquire that cost about 4 ms of Python a statement,
and each list length was a new statement for the server to prepare. Here the statement
text is the same whatever the list: PostgreSQL takes an array (``= ANY``, and
``array_position`` for an item's place), SQLite a JSON array it reads as a table
(``json_each``). MariaDB keeps the expanding ``IN`` (see :func:`listed`), and reads the
names to mark served from a JSON array (``JSON_TABLE``) joined to the channel rows.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import (
    BigInteger,
    Table,
    Text,
    any_,
    bindparam,
    func,
    literal,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement, TextClause
from sqlalchemy.types import TypeDecorator

from ...schema import MAX_QUEUE_NAME
from ...sqltime import db_now_plus
from ..mysql import statements as mysql_sql
from ..sqlite import statements as sqlite_sql
from .statements import render


class _ListParam(TypeDecorator[list[Any]]):
    """A list bound as a PostgreSQL array, or elsewhere as its JSON text."""

    impl = Text
    cache_ok = True

    def __init__(self, of: str) -> None:
        super().__init__()
        self.of = of

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(ARRAY(BigInteger if self.of == "id" else Text))
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            return list(value)
        return json.dumps(list(value))


def _param(key: str, of: str) -> Any:
    return bindparam(key, type_=_ListParam(of))


def _items(dialect: Dialect, key: str, of: str) -> Any:
    """The list's items as a subquery ``j``: each (``v``) and its place from 1 (``i``)."""
    if dialect.name == "sqlite":
        stmt = render(sqlite_sql.LIST_ITEMS, {"key": key})
    else:
        stmt = render(mysql_sql.LIST_ITEMS, {"key": key, "name_length": MAX_QUEUE_NAME})
    return text(stmt).bindparams(_param(key, of)).columns(
        literal_column("i"), literal_column("v")).subquery("j")


def listed(dialect: Dialect, column: Any, key: str, of: str = "name") -> ColumnElement[bool]:
    """``column`` is one of the list bound as ``key`` (``of``: "id" or "name"). MariaDB
    keeps the expanding ``IN``: it ran the list read from JSON as a subquery for every
    row of the table (a 500-id take of 20,000 rows went from 5 ms to a second)."""
    if dialect.name == "postgresql":
        return column == any_(_param(key, of))
    if dialect.name == "sqlite":
        return column.in_(select(_items(dialect, key, of).c.v))
    return column.in_(bindparam(key, expanding=True))


def served_in_order(dialect: Dialect, channel: Table, key: str) -> Any:
    """The channels' served mark: the rows of ``channel`` named in the list bound as
    ``key`` get ``served_at`` now and ``served_rank`` their place (from 1) in the list.

    The list is joined to the rows: a place looked up per row reads the whole list for
    each (a subquery on MariaDB took 120 ms for 500 names; PostgreSQL's
    ``array_position`` 12.5 ms of a 1,000-channel acquire's 55, the join 2.3 ms). On
    MariaDB the list comes first and the rows are found by their key (STRAIGHT_JOIN):
    left to choose, it read the whole channel table, locking each row on its way, so two
    processes marking their channels waited on each other's and deadlocked."""
    if dialect.name in ("mysql", "mariadb"):
        items = render(mysql_sql.LIST_ITEMS, {"key": key, "name_length": MAX_QUEUE_NAME})
        return text(render(mysql_sql.SERVED_IN_ORDER, {"items": items, "channel": channel.name})
                    ).bindparams(_param(key, "name"))
    if dialect.name == "postgresql":
        items = func.unnest(_param(key, "name")).table_valued(
            "v", with_ordinality="i").render_derived(name="j")
    else:
        items = _items(dialect, key, "name")
    return update(channel).where(channel.c.name == items.c.v).values(
        served_at=db_now_plus(literal(0.0)), served_rank=items.c.i)


def with_list(statement: str, key: str, of: str = "name") -> TextClause:
    """``statement`` (a database's own SQL text) with its parameter ``key`` bound to a
    list as the statements above take one."""
    return text(statement).bindparams(_param(key, of))


def list_rows(dialect: Dialect, key: str) -> Any:
    """The list of names bound as ``key`` as rows ``j`` of one column ``v`` (PostgreSQL
    and SQLite), to read something per name (a LATERAL, a correlated subquery)."""
    if dialect.name == "postgresql":
        return func.unnest(_param(key, "name")).table_valued("v").render_derived(name="j")
    return _items(dialect, key, "name")


__all__ = ["list_rows", "listed", "served_in_order", "with_list"]
