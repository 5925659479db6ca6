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

from .broker import Broker
from .connect import safe_url
from .errors import SqlmqError

DEFAULT_URL_ENV = "SQLMQ_URL"


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
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--processes", type=int, default=2)

    p = sub.add_parser("migrate", help="create or upgrade the sqlmq tables")
    _url_arg(p)

    p = sub.add_parser("worker", help="run the subscribers of module:broker until SIGINT/SIGTERM")
    p.add_argument("app", help="import path of a Broker, e.g. myapp.tasks:broker")
    p.add_argument("--graceful-timeout", type=float, default=None)

    p = sub.add_parser("publish", help="publish one message")
    _url_arg(p)
    p.add_argument("queue")
    p.add_argument("body", help="message body; JSON if it parses as JSON (see --text)")
    p.add_argument("--text", action="store_true", help="send the body as text, not JSON")
    p.add_argument("--header", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--delay", type=float, default=None, help="seconds")

    p = sub.add_parser("queues", help="message counts per queue and state")
    _url_arg(p)
    p.add_argument("--json", action="store_true")

    dlq = sub.add_parser("dlq", help="inspect, requeue or purge FAILED (dead-lettered) messages")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True)
    p = dsub.add_parser("list")
    _url_arg(p)
    p.add_argument("--queue")
    p.add_argument("--limit", type=int, default=50)
    p = dsub.add_parser("requeue")
    _url_arg(p)
    p.add_argument("--queue")
    p.add_argument("--id", type=int, action="append", dest="ids")
    p = dsub.add_parser("purge")
    _url_arg(p)
    p.add_argument("--queue")
    p.add_argument("--older-than", type=float, default=None, metavar="DAYS")

    p = sub.add_parser("report", help="archive analytics on Spark (see docs/spark.md)",
                       add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        from .spark.report import main as report_main

        return report_main(argv[1:])
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_run(args))
    except SqlmqError as exc:
        print(f"sqlmq: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _need_url(args: argparse.Namespace) -> str:
    if not args.url:
        raise SqlmqError(f"no database URL: pass --url or set ${DEFAULT_URL_ENV}")
    return args.url


async def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from .demo import run_demo

        return await run_demo(args.url, messages=args.messages, processes=args.processes)
    if args.command == "worker":
        return await _worker(args)
    broker = Broker(_need_url(args), table_prefix=args.prefix)
    try:
        return await _COMMANDS[args.command](broker, args)
    except SqlmqError:
        raise
    except Exception as exc:  # a database error: one line, no URL secrets
        from .backoff import describe

        raise SqlmqError(f"{describe(exc)} (database {broker.url})") from None
    finally:
        await broker.close()


async def _migrate(broker: Broker, args: argparse.Namespace) -> int:
    version = await broker.migrate()
    print(f"sqlmq schema at version {version} in {broker.url}")
    return 0


async def _publish(broker: Broker, args: argparse.Namespace) -> int:
    body: Any = args.body
    if not args.text:
        try:
            body = json.loads(args.body)
        except ValueError:
            body = args.body
    headers = {}
    for item in args.header:
        key, sep, value = item.partition("=")
        if not sep:
            raise SqlmqError(f"--header takes KEY=VALUE, got {item!r}")
        headers[key] = value
    await broker.check_schema()
    msg_id = await broker.publish(args.queue, body, headers=headers, delay=args.delay)
    print(msg_id)
    return 0


async def _queues(broker: Broker, args: argparse.Namespace) -> int:
    await broker.check_schema()
    stats = await broker.stats()
    if args.json:
        print(json.dumps([asdict(s) | {"oldest_ready_at": s.oldest_ready_at and
                                       s.oldest_ready_at.isoformat()} for s in stats]))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sqlmq queues in {broker.url}")
    for col in ("queue", "pending", "processing", "retryable", "completed", "failed",
                "oldest ready"):
        table.add_column(col, justify="left" if col == "queue" else "right")
    for s in stats:
        table.add_row(s.queue, str(s.pending), str(s.processing), str(s.retryable),
                      str(s.completed), str(s.failed),
                      s.oldest_ready_at.isoformat(timespec="seconds") if s.oldest_ready_at else "")
    Console().print(table)
    return 0


async def _dlq(broker: Broker, args: argparse.Namespace) -> int:
    await broker.check_schema()
    if args.dlq_command == "list":
        from sqlalchemy import select

        a = broker.schema.archive
        stmt = select(a.c.id, a.c.queue, a.c.deliveries_count, a.c.attempts_count,
                      a.c.archived_at, a.c.error).where(a.c.state == "FAILED")
        if args.queue:
            stmt = stmt.where(a.c.queue == args.queue)
        stmt = stmt.order_by(a.c.archived_at.desc()).limit(args.limit)
        async with broker.db.connect() as conn:
            found = (await conn.execute(stmt)).all()
        for r in found:
            print(f"{r.id}\t{r.queue}\tdeliveries={r.deliveries_count}\t"
                  f"attempts={r.attempts_count}\t{r.archived_at.isoformat(timespec='seconds')}\t"
                  f"{(r.error or '')[:120]}")
        print(f"{len(found)} failed message(s) shown", file=sys.stderr)
        return 0
    if args.dlq_command == "requeue":
        if not args.queue and not args.ids:
            raise SqlmqError("dlq requeue needs --queue or --id (refusing to requeue everything)")
        n = await broker.engine.requeue_archived(queue=args.queue, ids=args.ids)
        print(f"requeued {n} message(s)")
        return 0
    before = None
    if args.older_than is not None:
        before = datetime.now(UTC) - timedelta(days=args.older_than)
    n = await broker.engine.purge_archived(queue=args.queue, state="FAILED", before=before)
    print(f"purged {n} failed message(s)")
    return 0


async def _worker(args: argparse.Namespace) -> int:
    module_name, _, attr = args.app.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SqlmqError(f"cannot import {module_name!r}: {exc}") from None
    broker = getattr(module, attr or "broker", None)
    if not isinstance(broker, Broker):
        raise SqlmqError(f"{args.app!r} is not a sqlmq Broker (got {type(broker).__name__})")
    if not broker.subscribers:
        raise SqlmqError(f"{args.app!r} has no subscribers to run")
    logging.getLogger("sqlmq").info("sqlmq worker on %s: %d subscriber(s)", broker.url,
                                    len(broker.subscribers))
    if args.graceful_timeout is not None:
        for sub in broker.subscribers:
            sub.config.graceful_timeout = args.graceful_timeout
    await broker.run()
    return 0


_COMMANDS = {"migrate": _migrate, "publish": _publish, "queues": _queues, "dlq": _dlq}

if __name__ == "__main__":
    raise SystemExit(main())

__all__ = ["main", "safe_url"]
