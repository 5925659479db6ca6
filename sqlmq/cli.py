"""The ``sqlmq`` command line. Every sub-command goes through the public Broker API or the
engine contract; URLs are shown with the password masked, errors as one line."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from . import cli_channels
from .broker import Broker
from .connect import safe_url
from .errors import ConfigurationError, PublishError, SqlmqError
from .lifecycle import State

DEFAULT_URL_ENV = "SQLMQ_URL"

#: Exit statuses: 1 when the command could not do its work (a database error, a missing
#: dead letter), 2 when it was asked something it cannot do (argparse's own status).
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(SqlmqError):
    """Arguments the command cannot act on; exits 2 like argparse's own errors."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _not_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _url_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get(DEFAULT_URL_ENV),
                   help=f"database URL (default: ${DEFAULT_URL_ENV})")
    p.add_argument("--prefix", default="sqlmq_", help="table prefix (default: sqlmq_)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sqlmq", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="publish, consume, retry and dead-letter thousands of messages")
    p.add_argument("--url", default="sqlite:///sqlmq-demo.db",
                   help="database URL (default: sqlite:///sqlmq-demo.db)")
    p.add_argument("--messages", type=_positive_int, default=5000)
    p.add_argument("--processes", type=_positive_int, default=2)

    p = sub.add_parser("migrate", help="create or upgrade the sqlmq tables")
    _url_arg(p)

    p = sub.add_parser("worker", help="run the subscribers of module:broker until SIGINT/SIGTERM")
    p.add_argument("app", help="import path of a Broker, e.g. myapp.tasks:broker")
    p.add_argument("--graceful-timeout", type=float, default=None)

    p = sub.add_parser("publish", help="publish one message")
    _url_arg(p)
    p.add_argument("queue", help="the queue (with --topic: the topic)")
    p.add_argument("--topic", action="store_true",
                   help="publish to the topic QUEUE: a copy per consumer group it reaches")
    p.add_argument("body", help="message body: JSON, or any text with --text")
    p.add_argument("--text", action="store_true", help="send the body as text/plain, not JSON")
    p.add_argument("--header", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--delay", type=_not_negative, default=None, help="seconds")

    p = sub.add_parser("queues", help="message counts per queue and state")
    _url_arg(p)
    p.add_argument("--json", action="store_true")

    groups = sub.add_parser("groups", help="list or delete the consumer groups of topics")
    gsub = groups.add_subparsers(dest="groups_command", required=True)
    p = gsub.add_parser("list")
    _url_arg(p)
    p.add_argument("--json", action="store_true")
    p = gsub.add_parser("delete", help="delete a group and the copies in its queue")
    _url_arg(p)
    p.add_argument("pattern")
    p.add_argument("group")

    p = sub.add_parser("cancel", help="cancel messages: archive waiting ones CANCELLED, flag "
                                      "running ones")
    _url_arg(p)
    p.add_argument("ids", nargs="+", type=int, metavar="ID")
    p.add_argument("--json", action="store_true")

    cli_channels.add_parser(sub, _url_arg, _positive_int)

    p = sub.add_parser("schedules", help="periodic schedules: last and next tick, or --delete")
    _url_arg(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--delete", metavar="NAME", help="forget the schedule NAME and its ticks")

    dlq = sub.add_parser("dlq", help="inspect, requeue or purge FAILED (dead-lettered) messages")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True)
    p = dsub.add_parser("list")
    _url_arg(p)
    p.add_argument("--queue")
    p.add_argument("--limit", type=_positive_int, default=50)
    p.add_argument("--json", action="store_true", help="one JSON array, errors in full")
    p = dsub.add_parser("requeue")
    _url_arg(p)
    p.add_argument("--queue")
    p.add_argument("--id", type=int, action="append", dest="ids")
    p = dsub.add_parser("purge", help="delete dead letters: needs --queue and/or "
                                      "--older-than, or --all --yes")
    _url_arg(p)
    p.add_argument("--queue")
    p.add_argument("--older-than", type=_not_negative, default=None, metavar="DAYS")
    p.add_argument("--all", action="store_true", help="every dead letter of every queue")
    p.add_argument("--yes", action="store_true", help="confirm --all")

    p = sub.add_parser("report", help="archive analytics on Spark (see docs/spark.md)",
                       add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        return _report(argv[1:])
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_run(args))
    except (UsageError, ConfigurationError, PublishError) as exc:
        print(f"sqlmq: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SqlmqError as exc:
        print(f"sqlmq: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def _report(argv: list[str]) -> int:
    try:
        from .spark.report import main as report_main
    except ImportError as exc:  # pyspark (or pandas, matplotlib) is not installed
        print(f"sqlmq: error: sqlmq report runs on Spark and needs {exc.name or 'pyspark'}: "
              "pip install 'sqlmq[spark]'", file=sys.stderr)
        return EXIT_USAGE
    return report_main(argv)


def _need_url(args: argparse.Namespace) -> str:
    if not args.url:
        raise UsageError(f"no database URL: pass --url or set ${DEFAULT_URL_ENV}")
    return args.url


async def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from .demo import run_demo

        try:
            return await run_demo(args.url, messages=args.messages, processes=args.processes)
        except SqlmqError:
            raise
        except Exception as exc:  # a database error: one line, no URL secrets
            raise _database_error(exc, safe_url(args.url)) from None
    if args.command == "worker":
        return await _worker(args)
    broker = Broker(_need_url(args), table_prefix=args.prefix)
    try:
        return await _COMMANDS[args.command](broker, args)
    except SqlmqError:
        raise
    except Exception as exc:  # a database error: one line, no URL secrets
        raise _database_error(exc, broker.url) from None
    finally:
        await broker.close()


def _database_error(exc: Exception, shown_url: str) -> SqlmqError:
    from .backoff import describe

    return SqlmqError(f"{describe(exc)} (database {shown_url})")


async def _migrate(broker: Broker, args: argparse.Namespace) -> int:
    version = await broker.migrate()
    print(f"sqlmq schema at version {version} in {broker.url}")
    return 0


async def _publish(broker: Broker, args: argparse.Namespace) -> int:
    body: Any = args.body
    if not args.text:
        try:
            body = json.loads(args.body)
        except ValueError as exc:
            raise UsageError(
                f"the body is not valid JSON ({exc}); pass --text to publish it as text"
            ) from None
    headers = {}
    for item in args.header:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--header takes KEY=VALUE, got {item!r}")
        headers[key] = value
    await broker.check_schema()
    if args.topic:
        fanout = await broker.publish_topic(args.queue, body, headers=headers,
                                            delay=args.delay)
        print(json.dumps(fanout))  # {group queue: id}; {} when no group matched
        return 0
    msg_id = await broker.publish(args.queue, body, headers=headers, delay=args.delay)
    print(msg_id)
    return 0


async def _groups(broker: Broker, args: argparse.Namespace) -> int:
    await broker.check_schema()
    if args.groups_command == "delete":
        removed = await broker.delete_group(args.pattern, args.group)
        print(f"deleted group {args.group!r} of {args.pattern!r} and {removed} message(s) "
              f"in its queue")
        return 0
    found = await broker.groups()
    if args.json:
        print(json.dumps([{"pattern": g.pattern, "group": g.group, "queue": g.queue,
                           "created_at": g.created_at.isoformat()} for g in found]))
        return 0
    for g in found:
        print(f"{g.pattern}\t{g.group}\t{g.queue}\t{g.created_at.isoformat(timespec='seconds')}")
    return 0


async def _schedules(broker: Broker, args: argparse.Namespace) -> int:
    await broker.check_schema()
    if args.delete is not None:
        if not await broker.delete_schedule(args.delete):
            known = ", ".join(repr(s.name) for s in await broker.schedules()) or "none"
            raise SqlmqError(f"no schedule named {args.delete!r} (schedules: {known})")
        print(f"deleted schedule {args.delete!r}; a process still running it makes it again")
        return 0
    now = await broker.engine.now()
    rows = [{"name": s.name, "queue": s.queue, "cadence": s.cadence.describe(),
             "catch_up": s.catch_up,
             "last_tick": s.last_tick_at and s.last_tick_at.isoformat(),
             "last_message_id": s.last_message_id,
             "next_tick": s.next_tick(now).isoformat()} for s in await broker.schedules()]
    if args.json:
        print(json.dumps(rows))
        return 0
    print("\t".join(("name", "queue", "cadence", "catch_up", "last tick", "message",
                     "next tick")))
    for r in rows:
        print("\t".join("" if v is None else str(v) for v in r.values()))
    return 0


async def _cancel(broker: Broker, args: argparse.Namespace) -> int:
    """Cancel each id, one answer per line; exits 1 if an id names no message."""
    await broker.check_schema()
    found = [await broker.cancel(i) for i in args.ids]
    if args.json:
        print(json.dumps([{"id": c.id, "outcome": c.outcome, "state": c.state}
                          for c in found]))
    else:
        for c in found:
            print(c)
    return EXIT_FAILED if any(c.outcome == "unknown" for c in found) else 0


async def _queues(broker: Broker, args: argparse.Namespace) -> int:
    await broker.check_schema()
    stats = await broker.stats()
    if args.json:
        print(json.dumps([asdict(s) | {"oldest_ready_at": s.oldest_ready_at and
                                       s.oldest_ready_at.isoformat()} for s in stats]))
        return 0
    columns = ("queue", "pending", "processing", "retryable", "completed", "failed",
               "expired", "cancelled", "oldest ready")
    found = [(s.queue, str(s.pending), str(s.processing), str(s.retryable), str(s.completed),
              str(s.failed), str(s.expired), str(s.cancelled),
              s.oldest_ready_at.isoformat(timespec="seconds") if s.oldest_ready_at else "")
             for s in stats]
    if not sys.stdout.isatty():  # piped: whole names, one line per queue, tab-separated
        for line in (columns, *found):
            print("\t".join(line))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sqlmq queues in {broker.url}")
    for col in columns:
        table.add_column(col, justify="left" if col == "queue" else "right",
                         overflow="fold" if col == "queue" else "ellipsis")
    for row in found:
        table.add_row(*row)
    Console().print(table)
    return 0


async def _dlq(broker: Broker, args: argparse.Namespace) -> int:
    _check_dlq_args(args)  # before the database: a usage error is one whatever its state
    await broker.check_schema()
    if args.dlq_command == "list":
        return await _dlq_list(broker, args)
    if args.dlq_command == "requeue":
        return await _dlq_requeue(broker, args)
    return await _dlq_purge(broker, args)


async def _dlq_list(broker: Broker, args: argparse.Namespace) -> int:
    from sqlalchemy import select

    a = broker.schema.archive
    stmt = select(a.c.id, a.c.queue, a.c.deliveries_count, a.c.attempts_count,
                  a.c.archived_at, a.c.error).where(a.c.state == State.FAILED.value)
    if args.queue:
        stmt = stmt.where(a.c.queue == args.queue)
    stmt = stmt.order_by(a.c.archived_at.desc(), a.c.id.desc()).limit(args.limit)
    async with broker.db.connect() as conn:
        found = (await conn.execute(stmt)).all()
    if args.json:
        print(json.dumps([{"id": r.id, "queue": r.queue, "deliveries": r.deliveries_count,
                           "attempts": r.attempts_count, "archived_at": r.archived_at.isoformat(),
                           "error": r.error} for r in found]))
        return 0
    for r in found:
        print(f"{r.id}\t{r.queue}\tdeliveries={r.deliveries_count}\t"
              f"attempts={r.attempts_count}\t{r.archived_at.isoformat(timespec='seconds')}\t"
              f"{_one_line(r.error or '')[:120]}")
    print(f"{len(found)} failed message(s) shown", file=sys.stderr)
    return 0


def _one_line(text: str) -> str:
    """An error for a tab-separated line: a traceback's newlines and tabs escaped, so one
    dead letter stays one line (``--json`` has the text as it is)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace(
        "\r", "\\r")


def _check_dlq_args(args: argparse.Namespace) -> None:
    if args.dlq_command == "requeue" and not args.queue and not args.ids:
        raise UsageError("dlq requeue needs --queue or --id (refusing to requeue everything)")
    if args.dlq_command != "purge":
        return
    filtered = args.queue is not None or args.older_than is not None
    if args.all and filtered:
        raise UsageError("dlq purge: --all means every dead letter; drop --queue/--older-than")
    if not filtered and not args.all:
        raise UsageError("dlq purge needs --queue and/or --older-than DAYS, or --all --yes to "
                         "delete every dead letter of every queue")
    if args.all and not args.yes:
        raise UsageError("dlq purge --all deletes every dead letter of every queue: add --yes "
                         "to confirm")


async def _dlq_requeue(broker: Broker, args: argparse.Namespace) -> int:
    if args.ids:
        missing = sorted(set(args.ids) - await _dead_letter_ids(broker, args.ids, args.queue))
        if missing:
            where = f" in queue {args.queue!r}" if args.queue else ""
            raise SqlmqError(f"no dead letter with id {', '.join(map(str, missing))}{where}; "
                             "nothing requeued (see sqlmq dlq list)")
    n = await broker.engine.requeue_archived(queue=args.queue, ids=args.ids)
    print(f"requeued {n} message(s)")
    return 0


async def _dead_letter_ids(broker: Broker, ids: list[int], queue: str | None) -> set[int]:
    from sqlalchemy import select

    a = broker.schema.archive
    stmt = select(a.c.id).where(a.c.state == State.FAILED.value, a.c.id.in_(ids))
    if queue:
        stmt = stmt.where(a.c.queue == queue)
    async with broker.db.connect() as conn:
        return set((await conn.execute(stmt)).scalars())


async def _dlq_purge(broker: Broker, args: argparse.Namespace) -> int:
    before = None
    if args.older_than is not None:
        before = datetime.now(UTC) - timedelta(days=args.older_than)
    n = await broker.engine.purge_archived(queue=args.queue, state=State.FAILED.value,
                                           before=before)
    print(f"purged {n} failed message(s)")
    return 0


async def _worker(args: argparse.Namespace) -> int:
    module_name, _, attr = args.app.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    broker = getattr(module, attr or "broker", None)
    if not isinstance(broker, Broker):
        raise UsageError(f"{args.app!r} is not a sqlmq Broker (got {type(broker).__name__})")
    if not broker.subscribers and not broker.periodic_schedules:
        raise UsageError(f"{args.app!r} has no subscribers or schedules to run")
    if args.graceful_timeout is not None:
        for sub in broker.subscribers:
            sub.config.graceful_timeout = args.graceful_timeout
    try:
        await broker.run()  # logs start, signal, drain and stop
    except SqlmqError:
        raise
    except Exception as exc:  # the database refused the start: one line, no URL secrets
        raise _database_error(exc, broker.url) from None
    return 0


_COMMANDS = {"migrate": _migrate, "publish": _publish, "queues": _queues, "dlq": _dlq,
             "groups": _groups, "schedules": _schedules, "cancel": _cancel,
             "channels": cli_channels.run}

if __name__ == "__main__":
    raise SystemExit(main())

__all__ = ["main", "safe_url"]
