"""SQLAlchemy Core statements as text and arguments for the caller's own driver.

A publish on the caller's driver connection runs the same statements as one on a
SQLAlchemy connection: SQLAlchemy compiles them, for a dialect of that very driver, and
this module turns what it compiled into what the driver is sent. SQLAlchemy's own
execution adds three things, done here the same way:

* **Parameters.** :meth:`~sqlalchemy.sql.compiler.SQLCompiler.construct_expanded_state`
  gives each call's values (literals and defaults included, an expanding ``IN`` list
  expanded), and each value goes through its type's bind processor for the dialect (JSON
  encoded, a timezone-aware datetime made what the column stores), as SQLAlchemy's would.
* **One placeholder style per driver.** The compiled text is scanned for its placeholders
  the way its driver reads them (``$n`` outside literals on PostgreSQL; every ``%`` on the
  ``%s`` drivers, which format the whole text, literals included; ``?`` outside literals on
  SQLite), and they are written back numbered in order: ``%(name)s`` becomes ``%s``.
* **Many rows, one statement.** An INSERT given many rows goes as multi-row ``INSERT …
  VALUES (…), (…) [RETURNING …]`` statements, as SQLAlchemy's "insertmanyvalues" sends
  it: its ``VALUES`` group is repeated once per row, up to :data:`MAX_PARAMETERS`
  parameters a statement. An INSERT whose parameters are not all in that group is run a
  row at a time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Executable
from sqlalchemy.sql.dml import Insert
from sqlalchemy.types import TypeDecorator

from ....errors import ConfigurationError
from ..paramstyles import TOKENS

#: Parameters per multi-row statement: under every driver's and server's bound (asyncpg
#: and PostgreSQL 32,767; SQLite 32,766; MySQL 65,535).
MAX_PARAMETERS = 30_000

# Placeholders as each style's driver reads them. ``%%`` is a literal percent sign.
_FORMAT = re.compile(r"%%|%\((?P<name>[^)]*)\)s|(?P<p>%s)")
# SQLite: ``?`` outside string literals and quoted identifiers.
_QMARK = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|(?P<p>\?)""")
# A literal (skipped) or a parenthesis, to find where the VALUES group ends.
_PARENS = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|(?P<paren>[()])""")

#: Each target style's placeholder, by its 1-based number in the statement.
_PLACEHOLDERS: dict[str, Callable[[int], str]] = {
    "numeric_dollar": lambda n: f"${n}",
    "format": lambda n: "%s",
    "qmark": lambda n: "?",
}
#: The style a driver is sent, by the style its SQLAlchemy dialect compiles.
TARGET_STYLES = {"numeric_dollar": "numeric_dollar", "pyformat": "format", "format": "format",
                 "qmark": "qmark"}


@dataclass(frozen=True, slots=True)
class Template:
    """One compiled statement, as its driver is sent it: the text between the placeholders
    and the parameter each placeholder takes."""

    fragments: tuple[str, ...]
    names: tuple[str, ...]
    style: str
    #: Where the ``VALUES (…)`` group starts in the first fragment and ends in the last
    #: (past its ``)``), when every placeholder is inside it: an INSERT that can take many
    #: rows at once. None otherwise.
    group: tuple[int, int] | None = None

    def text(self, rows: int = 1) -> str:
        """The statement, with its VALUES group repeated for ``rows`` rows."""
        place = _PLACEHOLDERS[self.style]
        if rows == 1 or self.group is None:
            return self._join(self.fragments, place, 0)
        start, end = self.group
        first, last = self.fragments[0], self.fragments[-1]
        inner = (first[start:], *self.fragments[1:-1], last[:end])
        per_row = len(self.names)
        groups = ", ".join(self._join(inner, place, i * per_row) for i in range(rows))
        return first[:start] + groups + last[end:]

    @staticmethod
    def _join(fragments: Sequence[str], place: Callable[[int], str], offset: int) -> str:
        parts = [fragments[0]]
        for n, fragment in enumerate(fragments[1:], offset + 1):
            parts += (place(n), fragment)
        return "".join(parts)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A statement compiled once for a dialect and a set of parameter names, with what
    turns a call's parameters into the driver's arguments."""

    compiled: Any
    #: The template, if the statement's text does not depend on the call's values (no
    #: expanding ``IN``): else each call gets its own (:meth:`calls`).
    template: Template | None
    processors: Mapping[str, Callable[[Any], Any]]
    #: Each result column's processor (None: the value as the driver gives it).
    results: tuple[Callable[[Any], Any] | None, ...]

    def calls(self, params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
              ) -> Iterator[tuple[str, list[Any]]]:
        """The statements and arguments that run this statement with ``params`` (one
        mapping, or many: executemany)."""
        if params is None or isinstance(params, Mapping):
            yield self._one(params or {})
            return
        template = self.template
        if template is None or template.group is None or len(params) == 1:
            for row in params:
                yield self._one(row)
            return
        per_statement = max(1, MAX_PARAMETERS // max(1, len(template.names)))
        for start in range(0, len(params), per_statement):
            chunk = params[start : start + per_statement]
            args: list[Any] = []
            for row in chunk:
                args += self._args(template, self.compiled.construct_params(row), {})
            yield template.text(len(chunk)), args

    def _one(self, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        if self.template is not None:
            return (self.template.text(),
                    self._args(self.template, self.compiled.construct_params(params), {}))
        state = self.compiled.construct_expanded_state(params)
        template = _template(state.statement, self.compiled.dialect.paramstyle,
                             state.positiontup, grouped=False)
        return template.text(), self._args(template, state.parameters, state.processors)

    def _args(self, template: Template, values: Mapping[str, Any],
              expanded: Mapping[str, Callable[[Any], Any]]) -> list[Any]:
        processors = self.processors
        out = []
        for name in template.names:
            value = values[name]
            process = processors.get(name) or expanded.get(name)
            out.append(value if process is None else process(value))
        return out


def prepared(statement: Executable, dialect: Dialect,
             params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None) -> Prepared:
    """``statement`` compiled for ``dialect`` with the parameter names of ``params``, as
    SQLAlchemy compiles it for an execute (an INSERT's columns are the names given)."""
    first = params if params is None or isinstance(params, Mapping) else params[0]
    return _prepared(statement, dialect, tuple(sorted(first or ())))


@functools.lru_cache(maxsize=512)
def _prepared(statement: Executable, dialect: Dialect, keys: tuple[str, ...]) -> Prepared:
    compiled = statement.compile(dialect=dialect,  # type: ignore[attr-defined]
                                 column_keys=list(keys))
    processors = {}
    for bind, name in compiled.bind_names.items():
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            processors[compiled.escaped_bind_names.get(name, name)] = process
    template = None
    if not compiled.post_compile_params:
        template = _template(compiled.string, dialect.paramstyle, compiled.positiontup,
                             grouped=isinstance(statement, Insert))
    columns = getattr(statement, "exported_columns", ())
    return Prepared(compiled, template, processors,
                    tuple(_result_processor(c.type, dialect) for c in columns))


def _result_processor(type_: Any, dialect: Dialect) -> Callable[[Any], Any] | None:
    """What turns a column's value, as the driver returns it, into SQLAlchemy's: sqlmq's own
    types' (a UTC datetime from SQLite's text, or zoned); the drivers return the rest
    (integers, floats, text) as SQLAlchemy would. The dialects' own result processors are
    not used: some need the driver's type code of the column, which only their own cursor
    handling has."""
    if not isinstance(type_, TypeDecorator):
        return None
    if type(type_).process_result_value is TypeDecorator.process_result_value:
        return None
    return functools.partial(_decorated, type_, dialect)


def _decorated(type_: TypeDecorator[Any], dialect: Dialect, value: Any) -> Any:
    return type_.process_result_value(value, dialect)


def _template(text: str, style: str, positiontup: Sequence[str] | None,
              grouped: bool) -> Template:
    """Split ``text``, compiled in ``style``, at its placeholders (see the module's
    docstring); ``grouped``: find an INSERT's VALUES group."""
    target = TARGET_STYLES.get(style)
    if target is None:
        raise ConfigurationError(f"sqlmq cannot run statements compiled with the paramstyle "
                                 f"{style!r} on a driver connection")
    fragments: list[str] = []
    names: list[str] = []
    start = 0
    for found, name in _placeholders(text, style, positiontup):
        fragments.append(text[start:found.start()])
        names.append(name)
        start = found.end()
    fragments.append(text[start:])
    group = _values_group(fragments) if grouped and names else None
    return Template(tuple(fragments), tuple(names), target, group)


def _placeholders(text: str, style: str, positiontup: Sequence[str] | None,
                  ) -> Iterator[tuple[re.Match[str], str]]:
    """Each placeholder of ``text`` and the parameter it takes."""
    if style == "numeric_dollar":
        assert positiontup is not None
        for token in TOKENS.finditer(text):
            if token.group("n") is not None:
                yield token, positiontup[int(token.group("n")) - 1]
        return
    pattern = _QMARK if style == "qmark" else _FORMAT
    at = 0
    for token in pattern.finditer(text):
        if style == "pyformat" and token.group("name") is not None:
            yield token, token.group("name")
        elif token.group("p") is not None:
            assert positiontup is not None
            yield token, positiontup[at]
            at += 1


def _values_group(fragments: list[str]) -> tuple[int, int] | None:
    """Where an INSERT's ``VALUES (…)`` group starts (in the first fragment: no
    placeholder comes before it) and ends, past its ``)``, if that is in the last fragment
    (no placeholder after it); else None."""
    first = fragments[0]
    start = first.rfind("VALUES (")
    if start < 0:
        return None
    start += len("VALUES ")
    depth = 0
    for i, fragment in enumerate(fragments):
        offset = start if i == 0 else 0
        for token in _PARENS.finditer(fragment, offset):
            paren = token.group("paren")
            if paren is None:
                continue
            depth += 1 if paren == "(" else -1
            if depth == 0:
                return (start, token.end()) if i == len(fragments) - 1 else None
    return None


__all__ = ["MAX_PARAMETERS", "TARGET_STYLES", "Prepared", "Template", "prepared"]
