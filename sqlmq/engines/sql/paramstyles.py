"""PostgreSQL's ``$n`` statements in another driver's parameter style.

sqlmq writes PostgreSQL's statements for asyncpg, with the server's own ``$n`` parameters
(:mod:`sqlmq.engines.postgresql.statements`). A publish in the caller's transaction runs on the
caller's driver, which may take ``%s`` (psycopg2, psycopg 3, pg8000: ``format`` and
``pyformat``), ``?`` (``qmark``), ``:n`` (``numeric``) or ``:name`` (``named``). This module
rewrites a statement once for a style (the engine keeps the result per statement and style,
never per call) and then only reorders each call's arguments.

The rewrite replaces every ``$n`` outside string literals, quoted identifiers, comments and
dollar-quoted strings; for ``format``/``pyformat`` it doubles every literal ``%`` (those
drivers read ``%`` everywhere, literals included). A positional style takes its arguments
in the order the placeholders appear: a ``$n`` used twice, or out of order, takes the
argument twice, or out of order (``INSERT`` uses ``$1`` twice).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigurationError

#: What a rewrite must step over (group "n" is a parameter; anything else is kept as it is).
TOKENS = re.compile(
    r"""
      (?<![\w$])[Ee]'(?:[^'\\]|\\.|'')*'            # an escape string, E'it\'s'
    | '(?:[^']|'')*'                                # a string literal, 'it''s'
    | "(?:[^"]|"")*"                                # a quoted identifier
    | --[^\n]*                                      # a line comment
    | /\*.*?\*/                                     # a block comment
    | \$(?P<tag>(?:[A-Za-z_]\w*)?)\$.*?\$(?P=tag)\$  # a dollar-quoted string, $tag$...$tag$
    | (?<![\w$])\$(?P<n>[0-9]+)                     # a parameter
    """,
    re.DOTALL | re.VERBOSE,
)

#: The placeholder of parameter ``n`` in each style.
_PLACEHOLDERS = {
    "format": lambda n: "%s",
    "pyformat": lambda n: "%s",
    "qmark": lambda n: "?",
    "numeric": lambda n: f":{n}",
    "named": lambda n: f":p{n}",
}


@dataclass(frozen=True, slots=True)
class DriverStatement:
    """A statement in one driver's style, and how a call's ``$n`` arguments map onto it."""

    text: str
    #: For positional styles, the (0-based) argument each placeholder takes, in order; None
    #: when the arguments go as they are (``numeric_dollar``, ``numeric``) or by name.
    order: tuple[int, ...] | None = None
    named: bool = False

    def args(self, args: Sequence[Any]) -> Sequence[Any] | dict[str, Any]:
        """``args`` (those of the ``$n`` statement, ``$1`` first) for this statement."""
        if self.named:
            return {f"p{i}": value for i, value in enumerate(args, 1)}
        if self.order is None:
            return args
        return tuple([args[i] for i in self.order])


def for_paramstyle(text: str, paramstyle: str) -> DriverStatement:
    """``text``, written with ``$n`` parameters, in a DB-API ``paramstyle`` (or SQLAlchemy's
    ``numeric_dollar``, asyncpg's, which keeps it as it is). Meant to run once per
    statement and style: it scans the whole text."""
    if paramstyle == "numeric_dollar":
        return DriverStatement(text)
    placeholder = _PLACEHOLDERS.get(paramstyle)
    if placeholder is None:
        raise ConfigurationError(f"sqlmq cannot run its statements on a driver whose "
                                 f"paramstyle is {paramstyle!r}")
    escape = paramstyle in ("format", "pyformat")
    parts: list[str] = []
    order: list[int] = []
    start = 0
    for token in TOKENS.finditer(text):
        n = token.group("n")
        if n is None:
            continue
        parts += (_kept(text[start:token.start()], escape), placeholder(int(n)))
        order.append(int(n) - 1)
        start = token.end()
    parts.append(_kept(text[start:], escape))
    positional = paramstyle in ("format", "pyformat", "qmark")
    return DriverStatement("".join(parts), tuple(order) if positional else None,
                           named=paramstyle == "named")


def _kept(text: str, escape: bool) -> str:
    return text.replace("%", "%%") if escape else text


__all__ = ["TOKENS", "DriverStatement", "for_paramstyle"]
