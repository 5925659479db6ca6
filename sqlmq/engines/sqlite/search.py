"""The archive's text search on SQLite (see :mod:`sqlmq.search`): an FTS5 index of each
searchable row's header values and error, kept by triggers on the archive, read in
descending id order for a page of the newest matches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Integer, Select, select, text

from ...migrate import DatabaseSteps
from ...schema import Schema
from ..sql.statements import names_for, render, search_fields
from . import statements as sql


def _fields(names: dict[str, object]) -> dict[str, object]:
    return {**search_fields(names), "search": f"{names['a']}_search"}


class SqliteSearch:
    """``search_archive_text``'s statement and the index it reads (version 26)."""

    schema: Schema
    names: dict[str, object]

    def database_steps(self) -> DatabaseSteps:
        return {26: make_search_index}

    def archive_text_search(self, words: Sequence[str], limit: int,
                            before: int | None) -> Select[Any]:
        """The statement ``search_archive_text`` runs: a page of ids from the index, then
        their rows."""
        a = self.schema.archive
        params: dict[str, Any] = {"search": " ".join(f'"{w}"*' for w in words),
                                  "limit": limit}
        if before is not None:
            params["before"] = before
        hits = (text(render(sql.SEARCH_HITS if before is None else sql.SEARCH_HITS_BELOW,
                            _fields(self.names)))
                .bindparams(**params).columns(id=Integer).subquery("hits"))
        return select(a).join(hits, hits.c.id == a.c.id).order_by(a.c.id.desc())


def make_search_index(conn: Connection, schema: Schema) -> None:
    """Schema version 26 on SQLite: the index of :class:`SqliteSearch`, made anew and
    filled with the rows already archived; its triggers keep it from then on."""
    fields = _fields(names_for(schema))
    for statement in (sql.SEARCH_TABLE_DROP, sql.SEARCH_TABLE, sql.SEARCH_ON_INSERT,
                      sql.SEARCH_ON_DELETE, sql.SEARCH_ON_UPDATE, sql.SEARCH_FILL):
        conn.exec_driver_sql(render(statement, fields))


__all__ = ["SqliteSearch", "make_search_index"]
