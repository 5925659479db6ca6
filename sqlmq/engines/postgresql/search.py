"""The archive's text search on PostgreSQL (see :mod:`sqlmq.search`): a GIN index on the
``tsvector`` of each searchable row's header values and error (built in, no extension to
install), asked with a prefix ``tsquery`` of the searched words."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Boolean, Connection, Select, bindparam, func, literal_column, select

from ...migrate import DatabaseSteps
from ...schema import Schema
from ..sql.statements import names_for, render, search_fields
from . import statements as sql


class PgSearch:
    """``search_archive_text``'s statement and the index it reads (version 26)."""

    schema: Schema
    names: dict[str, object]

    def database_steps(self) -> DatabaseSteps:
        return {26: make_search_index}

    def archive_text_search(self, words: Sequence[str], limit: int,
                            before: int | None) -> Select[Any]:
        """The statement ``search_archive_text`` runs (the EXPLAIN test reads its plan):
        the ids the index gives (its expression and condition written as in the index, so
        the planner matches them), then the newest ``limit`` of those rows.

        The ids are a materialized CTE: on its own, the planner estimates a word's
        beginning in one row of a hundred, whatever the word, and reads the primary key
        backwards for ``ORDER BY id DESC LIMIT``, checking each row's words until it has
        enough, every row of the archive for a word no row has (200,000 rows: 1.3 s where
        the index takes 1 ms). Read from the index, a search costs what it finds: a word
        of a quarter of the rows, 80 ms on 200,000 rows."""
        a = self.schema.archive
        fields = search_fields(self.names)
        query = " & ".join(f"{w}:*" for w in words)  # letters and digits only: no quoting
        document = literal_column(render(sql.SEARCH_DOCUMENT, fields))
        found = select(a.c.id).where(
            literal_column(render(sql.SEARCHABLE, fields), Boolean),
            document.op("@@", is_comparison=True)(
                func.to_tsquery(literal_column("'simple'::regconfig"),
                                bindparam("search", query))))
        if before is not None:
            found = found.where(a.c.id < before)
        hits = found.cte("hits").prefix_with("MATERIALIZED")
        newest = select(hits.c.id).order_by(hits.c.id.desc()).limit(limit)
        return select(a).where(a.c.id.in_(newest)).order_by(a.c.id.desc())


def make_search_index(conn: Connection, schema: Schema) -> None:
    """Schema version 26 on PostgreSQL: the index of :class:`PgSearch`."""
    conn.exec_driver_sql(render(sql.SEARCH_INDEX, search_fields(names_for(schema))))


__all__ = ["PgSearch", "make_search_index"]
