"""The dashboard as an ASGI application: :func:`create_app` puts the routes of
:mod:`.pages` (reading) and :mod:`.actions` (writing), the static files and the
protections of :mod:`.auth` together over one :class:`~sqlmq.Broker`.

``sqlmq dashboard`` serves it with uvicorn; an application of your own may mount it::

    from starlette.routing import Mount
    from sqlmq.dashboard import create_app

    routes = [Mount("/sqlmq", app=create_app(broker, token="…"))]

The broker is the caller's: the app neither migrates nor closes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from ..broker import Broker
from . import actions, bulk, channels, groups, live, pages, schedules, search, workflows
from .auth import SecurityHeaders, TokenGate
from .context import Dashboard

STATIC = Path(__file__).parent / "static"


def create_app(broker: Broker, *, token: str | None = None, read_only: bool = False,
               allowed_hosts: Sequence[str] | None = None, refresh: float = 5.0) -> Starlette:
    """The dashboard over ``broker``.

    ``token``: every request must carry it (see :mod:`.auth`); without one, anyone who
    reaches the address can read the messages and, unless ``read_only``, requeue, purge
    and pause. ``read_only``: no write is offered and every POST answers 403.
    ``allowed_hosts``: the ``Host`` names accepted (None: any); ``sqlmq dashboard`` sets
    the loopback names when it serves on loopback without a token, so a web page cannot
    reach it through DNS rebinding. ``refresh``: seconds between two refreshes of a live
    page."""
    if token is not None and not token.strip():
        raise ValueError("the dashboard's token must not be empty")
    if not refresh > 0:
        raise ValueError(f"refresh must be a positive number of seconds, got {refresh!r}")
    middleware = [Middleware(SecurityHeaders)]
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    if token is not None:
        middleware.append(Middleware(TokenGate, token=token))
    app = Starlette(
        routes=[*pages.routes, *workflows.routes, *actions.routes, *channels.routes,
                *schedules.routes, *groups.routes, *bulk.routes, *live.routes,
                *search.routes,
                Mount("/static", app=StaticFiles(directory=STATIC), name="static")],
        middleware=middleware,
        exception_handlers={404: _not_found, 405: _not_allowed})
    app.state.dashboard = Dashboard(broker, read_only=read_only, refresh=refresh)
    return app


async def _not_found(request: Request, exc: Exception) -> Response:
    return _status(request, 404, f"no page at {request.url.path}")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    if request.method == "POST":  # a write to a reading page
        return _status(request, 405, f"{request.url.path} is not a write: nothing done")
    return _status(request, 405, f"{request.method} is not allowed on {request.url.path} "
                                 "(a write is a POST from the dashboard's pages)")


def _status(request: Request, status: int, message: str) -> Response:
    dash: Dashboard = request.app.state.dashboard
    kind = "json" if request.url.path.startswith(
        f"{request.scope.get('root_path', '')}/api/") else "page"
    return dash.problem(request, kind, status, message)


__all__ = ["create_app"]
