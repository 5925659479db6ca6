"""What every ``sqlmq`` command shares: the database options, the runner that turns a
coroutine over a :class:`~sqlmq.Broker` into a command with one-line errors, the argument
types (positive counts, durations), and output as a table, tab-separated lines or JSON."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import click

from ..broker import Broker
from ..errors import SqlmqError

DEFAULT_URL_ENV = "SQLMQ_URL"

#: Exit statuses: 1 when the command could not do its work (a database error, a missing
#: dead letter), 2 when it was asked something it cannot do (as click's own usage errors).
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(SqlmqError):
    """Arguments the command cannot act on; exits 2 like click's own usage errors."""


class PositiveInt(click.ParamType):
    name = "N"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        try:
            n = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a whole number", param, ctx)
        if n < 1:
            self.fail(f"must be at least 1, got {n}", param, ctx)
        return n


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


class Duration(click.ParamType):
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w``; a bare number is ``bare_unit`` (days where a
    command took days before units existed)."""

    name = "DURATION"

    def __init__(self, bare_unit: str = "d") -> None:
        self.bare_unit = bare_unit

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        text = str(value)
        if text.strip().startswith("-"):
            self.fail(f"must be zero or more, got {text}", param, ctx)
        found = _DURATION.match(text)
        if found is None:
            self.fail(f"{text!r} is not a duration: write a number and a unit, s, m, h, d or "
                      "w (90s, 15m, 12h, 7d)", param, ctx)
        number, unit = found.groups()
        return timedelta(seconds=float(number) * _UNITS[unit or self.bare_unit])


def database(fn: Callable[..., Awaitable[int | None]]) -> Callable[..., int]:
    """Make ``async fn(broker, **params)`` a command taking ``--url``/``--prefix``: it runs
    on a broker for that database, closed afterwards; a database error is one line with the
    URL's password masked."""

    @click.option("--prefix", default="sqlmq_", show_default=True, help="table prefix")
    @click.option("--url", envvar=DEFAULT_URL_ENV, metavar="URL",
                  help=f"database URL (default: ${DEFAULT_URL_ENV})")
    @functools.wraps(fn)
    def command(url: str | None, prefix: str, **params: Any) -> int:
        if not url:
            raise UsageError(f"no database URL: pass --url or set ${DEFAULT_URL_ENV}")

        async def run() -> int:
            broker = Broker(url, table_prefix=prefix)
            try:
                return await fn(broker, **params) or 0
            except (SqlmqError, BrokenPipeError):  # `sqlmq … | head`: click exits quietly
                raise
            except Exception as exc:  # a database error: one line, no URL secrets
                raise database_error(exc, broker.url) from None
            finally:
                await broker.close()

        return asyncio.run(run())

    return command


def database_error(exc: Exception, shown_url: str) -> SqlmqError:
    from ..backoff import describe

    return SqlmqError(f"{describe(exc)} (database {shown_url})")


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True,
                        help="print JSON instead of a table")(fn)


def print_json(value: Any) -> None:
    print(json.dumps(value, default=str))


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A Rich table on a terminal; piped, tab-separated lines with a header line and whole
    values (a script cuts columns; a table would fold long queue names)."""
    if not sys.stdout.isatty():
        for line in (columns, *rows):
            print("\t".join(line))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right",
                         overflow="fold" if i == 0 else "ellipsis")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def one_line(text: str) -> str:
    """Text for a tab-separated line: a traceback's newlines and tabs escaped, so one row
    stays one line (``--json`` has the text as it is)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace(
        "\r", "\\r")


def ago(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return str(timedelta(seconds=round(seconds)))




async def in_batches(verb: str, total: int,
                     run: Callable[[Callable[[int], None]], Awaitable[int]]) -> int:
    """Await ``run(progress)`` (a :class:`~sqlmq.Broker` repair, which calls ``progress``
    with its running total after each batch of one transaction) with a progress bar on a
    terminal. Ctrl-C cancels the batch in flight, whose transaction rolls back, and says
    exactly how many were done before it."""
    from rich.progress import Progress

    done = 0
    with Progress(disable=not sys.stderr.isatty(), transient=True) as bar:
        task = bar.add_task(verb, total=total or None)

        def progress(n: int) -> None:
            nonlocal done
            done = n
            bar.update(task, completed=n)

        try:
            return await run(progress)
        except asyncio.CancelledError:
            print(f"sqlmq: interrupted: {verb} {done} message(s); the batch in progress was "
                  "rolled back", file=sys.stderr)
            raise


__all__ = ["DEFAULT_URL_ENV", "EXIT_FAILED", "EXIT_INTERRUPTED",
           "EXIT_USAGE", "Duration", "PositiveInt", "UsageError", "ago", "database",
           "database_error", "in_batches", "json_option", "one_line", "print_json",
           "print_table"]
