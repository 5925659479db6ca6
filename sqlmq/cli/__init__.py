"""The ``sqlmq`` command line, on Click with Rich for tables and progress.

Every command reads through :mod:`sqlmq.insights` or acts through the public Broker API
and the engine contract; none writes its own SQL. Errors are one line on stderr (the
database URL's password masked), with exit status 2 for a command that cannot be done as
asked (bad arguments, a bad URL) and 1 for one whose work failed (a database error, an
unknown id); Ctrl-C exits 130.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import click

from ..connect import safe_url
from ..errors import ConfigurationError, PublishError, SqlmqError
from .archive import dlq, purge
from .common import (
    DEFAULT_URL_ENV,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    UsageError,
)
from .dashboard import dashboard
from .inbox import inbox
from .messages import cancel, inspect, publish, queues, show
from .operations import pause, resume, workers
from .relay import relay
from .run import demo, migrate, worker
from .topology import channels, groups, schedules
from .workflows import signal, workflows


@click.group("sqlmq", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="debug logging")
def cli(verbose: bool) -> None:
    """sqlmq: a message broker in the database you already run.

    Commands taking --url also read $SQLMQ_URL; read commands take --json."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


for _command in (demo, migrate, worker, publish, queues, inspect, show, cancel, dlq, purge,
                 pause, resume, workers, groups, channels, schedules, dashboard, inbox,
                 relay, workflows, signal):
    cli.add_command(_command)


@cli.command("report", context_settings={"ignore_unknown_options": True,
                                          "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def report(args: tuple[str, ...]) -> int:
    """Archive analytics on Spark (see docs/spark.md; sqlmq report --help)."""
    return _report(list(args))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = cli.main(args=args, prog_name="sqlmq", standalone_mode=False)
    except click.UsageError as exc:  # click's own: bad options, missing arguments
        where = exc.ctx.command_path if exc.ctx is not None else "sqlmq"
        print(f"sqlmq: error: {exc.format_message()} (see {where} --help)", file=sys.stderr)
        return EXIT_USAGE
    except click.ClickException as exc:
        print(f"sqlmq: error: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    except (UsageError, ConfigurationError, PublishError) as exc:
        print(f"sqlmq: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SqlmqError as exc:
        print(f"sqlmq: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return result if isinstance(result, int) else 0


def _report(argv: list[str]) -> int:
    try:
        from ..spark.report import main as report_main
    except ImportError as exc:  # pyspark (or pandas, matplotlib) is not installed
        print(f"sqlmq: error: sqlmq report runs on Spark and needs {exc.name or 'pyspark'}: "
              "pip install 'sqlmq[spark]'", file=sys.stderr)
        return EXIT_USAGE
    return report_main(argv)


__all__ = ["DEFAULT_URL_ENV", "cli", "main", "safe_url"]
