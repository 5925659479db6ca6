"""Each database's statements, one module per database, as named constants.

The same operation has the same name in every module (``ACQUIRE``, ``SETTLE``, ``EXTEND``,
``RECOVER_EXPIRED``, ``INSERT`` …), so a reader compares them side by side. Parameters are
in the style of whatever runs the statement: ``$n`` for PostgreSQL (asyncpg, or SQLAlchemy's
asyncpg dialect through ``exec_driver_sql``), ``%s`` for statements sent straight to the
MySQL driver, ``:name`` for SQLite and for MySQL statements run through SQLAlchemy's
``text()``.

Table names (and a few constants such as ``{history_limit}``) are written as ``{m}``,
``{a}`` … and filled in once, by :func:`render`, when an engine is built: never per call.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...records import HISTORY_LIMIT
from ...schema import Schema


def render(text: str, names: Mapping[str, object]) -> str:
    """``text`` with its ``{name}`` fields filled in: the one way statements are completed."""
    return text.format(**names)


def names_for(schema: Schema) -> dict[str, object]:
    """The fields every statement may use: the tables of ``schema``'s prefix, and the
    number of history entries a message keeps."""
    return {**schema.names, "history_limit": HISTORY_LIMIT}


#: The fair acquire's per-row check that message ``f``'s channel has no limits, by its own
#: settings or else its queue's default: the raw-SQL twin of ``core_fair.limited`` (negated),
#: shared by PostgreSQL's ``ACQUIRE_FAIR`` and MariaDB's ``FAIR_PICK``.
WITHOUT_LIMITS = """(SELECT CASE WHEN c.configured = 1
                   THEN c.max_concurrency IS NULL AND c.rate IS NULL AND c.ordered = 0
                   ELSE d.queue IS NULL OR (d.max_concurrency IS NULL
                                            AND d.rate IS NULL AND d.ordered = 0) END
       FROM {channel} AS c LEFT JOIN {channel_default} AS d ON d.queue = c.queue
       WHERE c.name = f.channel)"""


__all__ = ["WITHOUT_LIMITS", "names_for", "render"]
