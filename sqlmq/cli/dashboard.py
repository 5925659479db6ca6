"""``sqlmq dashboard``: the web dashboard (:mod:`sqlmq.dashboard`), served by uvicorn.

Safe by default: it listens on 127.0.0.1 only, and refuses any other address unless a
token guards it, since whoever reaches it reads the messages and may requeue, purge and
pause. Without a token on loopback, requests must name a loopback host (so a web page
cannot reach it through DNS rebinding).
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

from ..broker import Broker
from ..errors import SqlmqError
from .common import UsageError, database

TOKEN_ENV = "SQLMQ_DASHBOARD_TOKEN"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def missing_requirement() -> str | None:
    """The first package of the ``dashboard`` extra that cannot be imported, or None."""
    from ..dashboard import REQUIRES

    for name in REQUIRES:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


@click.command("dashboard")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on; other than loopback needs --token")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="port (0: any free one, printed)")
@click.option("--token", envvar=TOKEN_ENV, metavar="TOKEN",
              help=f"every request must carry it (default: ${TOKEN_ENV})")
@click.option("--read-only", is_flag=True, help="offer no write; every POST answers 403")
@click.option("--refresh", type=click.FloatRange(min=1), default=5.0, show_default=True,
              help="seconds between refreshes of a live page")
@database
async def dashboard(broker: Broker, host: str, port: int, token: str | None, read_only: bool,
                    refresh: float) -> int:
    """The web dashboard: queues, charts, the archive, messages, workers, and the repairs
    (requeue, delete, purge, pause, resume), each confirmed. See docs/dashboard.md."""
    if token is not None and not token.strip():
        raise UsageError(f"the token is empty: pass --token or set ${TOKEN_ENV} to a secret")
    if token is None and not is_loopback(host):
        raise UsageError(f"refusing to serve on {host} without a token: anyone who reaches "
                         f"it could read messages and requeue or purge them (pass --token or "
                         f"set ${TOKEN_ENV}, or serve on 127.0.0.1)")
    missing = missing_requirement()
    if missing is not None:
        raise UsageError(f"sqlmq dashboard needs {missing}: pip install 'sqlmq[dashboard]'")
    import uvicorn

    from ..dashboard import create_app

    await broker.check_schema()
    app = create_app(broker, token=token, read_only=read_only, refresh=refresh,
                     allowed_hosts=None if token is not None or not is_loopback(host)
                     else [*LOOPBACK_NAMES, host.lower()])
    sock = _listen(host, port)
    shown_host = f"[{host.strip('[]')}]" if ":" in host else host
    print(f"sqlmq dashboard on http://{shown_host}:{sock.getsockname()[1]}/ (database "
          f"{broker.url}, prefix {broker.schema.prefix}"
          f"{', read-only' if read_only else ''}{', token required' if token else ''})",
          flush=True)
    if token is None:
        print("no token: only this machine can reach it", file=sys.stderr, flush=True)
    # Uvicorn's own logging setup would replace the command's; its access log is off, as
    # it would write the ?token= of a first visit.
    server = _server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                    server_header=False))
    await server.serve(sockets=[sock])
    await app.state.dashboard.jobs.stop()  # a bulk repair in flight: its batch rolls back
    return 0


def _server(config: Any) -> Any:
    """A uvicorn server that stops gracefully on SIGINT or SIGTERM and returns, so the
    broker is closed after it. (Uvicorn's own sends the signal again once stopped, which
    would cancel that close half-way.)"""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            saved = {sig: signal.signal(sig, self.handle_exit)
                     for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in saved.items():
                    signal.signal(sig, handler)

    return Server(config)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host.strip("[]"), port), family=family, backlog=128)
    except OSError as exc:
        raise SqlmqError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


__all__ = ["TOKEN_ENV", "dashboard", "is_loopback"]
