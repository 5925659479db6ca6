"""The archive's text search on MySQL and MariaDB (see :mod:`sqlmq.search`): an InnoDB
FULLTEXT index on a stored column of each searchable row's words, asked in boolean mode
with each searched word required as a word's beginning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Select, inspect, select, text

from ...migrate import DatabaseSteps
from ...schema import Schema
from ..sql.statements import names_for, render, search_fields
from . import statements as sql


class MysqlSearch:
    """``search_archive_text``'s statement and the index it reads (version 26)."""

    schema: Schema
    names: dict[str, object]

    def database_steps(self) -> DatabaseSteps:
        return {26: make_search_index}

    def archive_text_search(self, words: Sequence[str], limit: int,
                            before: int | None) -> Select[Any]:
        """The statement ``search_archive_text`` runs."""
        a = self.schema.archive
        stmt = select(a).where(text(sql.SEARCH_MATCH).bindparams(
            search=" ".join(f"+{w}*" for w in words)))  # letters and digits: no quoting
        if before is not None:
            stmt = stmt.where(a.c.id < before)
        return stmt.order_by(a.c.id.desc()).limit(limit)


def make_search_index(conn: Connection, schema: Schema) -> None:
    """Schema version 26 on MySQL and MariaDB: the column and index of
    :class:`MysqlSearch`, those the archive has not yet."""
    a = schema.archive.name
    fields = search_fields(names_for(schema))
    found = inspect(conn)
    additions = []
    if "search_text" not in {c["name"] for c in found.get_columns(a)}:
        additions.append("ADD COLUMN " + render(sql.SEARCH_COLUMN, fields))
    if f"ft_{a}_search" not in {ix["name"] for ix in found.get_indexes(a)}:
        additions.append("ADD " + render(sql.SEARCH_INDEX, fields))
    if not additions:
        return
    stopwords = conn.exec_driver_sql(sql.SEARCH_STOPWORDS).scalar()
    conn.exec_driver_sql(render(sql.SEARCH_STOPWORDS_SET, {"on": "OFF"}))
    try:
        conn.exec_driver_sql(render(sql.SEARCH_ADD, {**fields,
                                                     "additions": ", ".join(additions)}))
    finally:
        conn.exec_driver_sql(render(sql.SEARCH_STOPWORDS_SET,
                                    {"on": "ON" if stopwords else "OFF"}))


__all__ = ["MysqlSearch", "make_search_index"]
