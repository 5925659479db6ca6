"""``sqlmq demo``, ``migrate`` and ``worker``: set up the tables and run subscribers."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys

import click

from ..broker import Broker
from ..connect import safe_url
from ..errors import SqlmqError
from .common import PositiveInt, UsageError, database, database_error


@click.command("demo")
@click.option("--url", default="sqlite:///sqlmq-demo.db", show_default=True,
              help="database URL")
@click.option("--messages", type=PositiveInt(), default=5000, show_default=True)
@click.option("--processes", type=PositiveInt(), default=2, show_default=True)
@click.option("--prefix", default="sqlmq_demo_", show_default=True,
              help="table prefix (its tables are dropped first)")
def demo(url: str, messages: int, processes: int, prefix: str) -> int:
    """Publish, consume, retry and dead-letter thousands of messages. Handler tracebacks go
    to a log file the summary names."""
    from ..demo import run_demo

    async def run() -> int:
        try:
            return await run_demo(url, messages=messages, processes=processes, prefix=prefix)
        except SqlmqError:
            raise
        except Exception as exc:  # a database error: one line, no URL secrets
            raise database_error(exc, safe_url(url)) from None

    return asyncio.run(run())


@click.command("migrate")
@database
async def migrate(broker: Broker) -> int:
    """Create or upgrade the sqlmq tables (safe from many processes at once)."""
    version = await broker.migrate()
    print(f"sqlmq schema at version {version} in {broker.url}")
    return 0


@click.command("worker")
@click.argument("app")
@click.option("--graceful-timeout", type=click.FloatRange(min=0), default=None,
              help="seconds running handlers get to finish on SIGTERM")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="serve Prometheus metrics on this port (0: a free one)")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="the address the metrics listen on")
def worker(app: str, graceful_timeout: float | None, metrics_port: int | None,
           metrics_host: str) -> int:
    """Run the subscribers and schedules of APP (module:broker, e.g. myapp.tasks:broker)
    until SIGINT/SIGTERM."""
    module_name, _, attr = app.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    broker = getattr(module, attr or "broker", None)
    if not isinstance(broker, Broker):
        raise UsageError(f"{app!r} is not a sqlmq Broker (got {type(broker).__name__})")
    if not broker.subscribers and not broker.periodic_schedules:
        raise UsageError(f"{app!r} has no subscribers or schedules to run")
    if graceful_timeout is not None:
        for sub in broker.subscribers:
            sub.config.graceful_timeout = graceful_timeout
    if metrics_port is not None:
        from ..metrics import serve_metrics

        serve_metrics(broker, metrics_port, metrics_host)  # logs the address once serving

    async def run() -> int:
        try:
            await broker.run()  # logs start, signal, drain and stop
        except SqlmqError:
            raise
        except Exception as exc:  # the database refused the start: one line, no secrets
            raise database_error(exc, broker.url) from None
        return 0

    return asyncio.run(run())


__all__ = ["demo", "migrate", "worker"]
