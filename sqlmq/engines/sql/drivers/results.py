"""A statement's result on the caller's driver, read as a publish flow reads SQLAlchemy's.

The flows of :mod:`..publish`, :mod:`..room` and :mod:`..topics` read a result with
``one()``, ``first()``, ``scalar_one()``, by iterating its rows, by a row's column names
(``row.configured``) and, on MySQL, by ``lastrowid``: that is what :class:`DriverResult`
has. Every driver's rows come as plain tuples (sqlmq asks its cursor for them, whatever
row factory the caller's connection uses), with sqlmq's own column types' processing
applied, as SQLAlchemy's result applies it (see :func:`.statements.prepared`).
"""

from __future__ import annotations

import functools
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import MultipleResultsFound, NoResultFound


@dataclass(slots=True)
class DriverRows:
    """What a driver returned for one statement: its columns' names (None when it returned
    no rows and cannot say without them), its rows as tuples, and the id of the row it
    inserted (MySQL's ``lastrowid``; None where the driver has none)."""

    keys: Sequence[str] | None
    rows: list[tuple[Any, ...]]
    lastrowid: int | None = None


def column_names(cursor: Any) -> tuple[str, ...] | None:
    """A DB-API cursor's column names, None after a statement that returns no rows."""
    description = cursor.description
    return None if description is None else tuple(c[0] for c in description)


class DriverResult:
    """The rows of one statement (of all its calls, for many rows at once), processed."""

    __slots__ = ("_rows", "lastrowid")

    def __init__(self, parts: Sequence[DriverRows],
                 processors: Sequence[Callable[[Any], Any] | None]) -> None:
        keys = next((p.keys for p in parts if p.keys is not None), ())
        make = _row_type(tuple(keys))
        rows = [row for p in parts for row in p.rows]
        if any(processors) and rows and len(rows[0]) == len(processors):
            rows = [tuple(v if f is None else f(v) for f, v in zip(processors, r, strict=True))
                    for r in rows]
        self._rows = [make(*r) for r in rows]
        self.lastrowid = parts[-1].lastrowid if parts else None

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def all(self) -> list[Any]:
        return list(self._rows)

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def one_or_none(self) -> Any:
        if len(self._rows) > 1:
            raise MultipleResultsFound("more than one row where one was expected")
        return self.first()

    def one(self) -> Any:
        row = self.one_or_none()
        if row is None:
            raise NoResultFound("no row where one was expected")
        return row

    def scalar(self) -> Any:
        row = self.first()
        return None if row is None else row[0]

    def scalar_one(self) -> Any:
        return self.one()[0]


@functools.lru_cache(maxsize=256)
def _row_type(keys: tuple[str, ...]) -> Callable[..., Any]:
    """A row with these column names (any that is not an identifier is renamed): made
    once per set of names."""
    if not keys:
        return lambda *values: values
    return namedtuple("Row", keys, rename=True)  # type: ignore[misc]


__all__ = ["DriverResult", "DriverRows", "column_names"]
