"""What every route of the dashboard shares: the broker, the templates, the anti-forgery
token, and the one place where a failure becomes an answer.

A route never lets an exception reach the server: a :class:`~.views.Problem` (a bad
parameter, an unknown id) is its status and message; a database that does not answer is a
503 naming the error (and, when the tables are missing or old, what to run); anything else
is a 500 that points to the log, where the traceback is. The pages, the JSON and the
refreshed fragments each get the form their reader expects.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from jinja2 import Environment, PackageLoader, select_autoescape
from sqlalchemy.exc import DBAPIError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from ..backoff import describe
from ..broker import Broker
from ..errors import ConfigurationError, SchemaError, SqlmqError
from ..insights import WINDOWS
from . import views
from .auth import new_secret
from .jobs import Jobs
from .views import Problem

log = logging.getLogger("sqlmq.dashboard")

NOTICE_COOKIE = "sqlmq_dashboard_notice"
#: What a route answers with: a page, JSON, or a fragment a page refreshes itself with.
Kind = Literal["page", "json", "fragment"]
Endpoint = Callable[[Request, "Dashboard"], Awaitable[Response]]


def _templates() -> Jinja2Templates:
    env = Environment(loader=PackageLoader("sqlmq.dashboard", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(age=views.age, seconds=views.seconds, count=views.count,
                       per_minute=views.per_minute, when=views.when,
                       first_line=views.first_line)
    env.globals.update(WINDOWS=list(WINDOWS), COUNTS=views.COUNTS, next_tick=views.next_tick)
    return Jinja2Templates(env=env)


class Dashboard:
    """One dashboard over one broker (``request.app.state.dashboard``)."""

    def __init__(self, broker: Broker, *, read_only: bool, refresh: float) -> None:
        self.broker = broker
        self.read_only = read_only
        #: Seconds between two refreshes of a live page.
        self.refresh = refresh
        #: The anti-forgery token of this process's forms (see :mod:`.auth`).
        self.csrf = new_secret()
        self.templates = _templates()
        #: The bulk repairs running or done (see :mod:`.jobs`).
        self.jobs = Jobs()

    def render(self, request: Request, template: str, *, status_code: int = 200,
               **context: Any) -> Response:
        notice = _read_notice(request)
        response = self.templates.TemplateResponse(request, template, {
            "base": request.scope.get("root_path", ""), "read_only": self.read_only,
            "csrf": self.csrf, "db_url": self.broker.url, "prefix": self.broker.schema.prefix,
            "refresh_ms": int(self.refresh * 1000), "notice": notice,
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            **context}, status_code=status_code)
        if notice is not None:
            response.delete_cookie(NOTICE_COOKIE, path=_cookie_path(request))
        return response

    def done(self, request: Request, to: str, notice: str) -> Response:
        """The answer to a write that was carried out: back to ``to`` (a path of the
        dashboard), which shows ``notice`` once."""
        response = RedirectResponse(to, status_code=303)
        response.set_cookie(NOTICE_COOKIE, base64.urlsafe_b64encode(notice[:500].encode())
                            .decode(), httponly=True, samesite="strict", max_age=60,
                            path=_cookie_path(request))
        return response

    def problem(self, request: Request, kind: Kind, status: int, message: str) -> Response:
        if kind == "json":
            return JSONResponse({"error": message, "status": status}, status)
        if kind == "fragment":
            return PlainTextResponse(message, status)
        try:
            return self.render(request, "error.html", status_code=status, title=f"{status}",
                               status=status, message=message)
        except Exception:  # the error page must not fail in turn: plain text then
            log.exception("dashboard: the error page failed")
            return PlainTextResponse(f"{status}: {message}", status)

    async def diagnose(self, exc: BaseException) -> Problem:
        """What to tell about a database error: a missing or old schema says what to run
        (found by asking the database, which answers only if it is up)."""
        if isinstance(exc, SchemaError):
            return Problem(503, str(exc))
        try:  # bounded: a database that did not answer may not answer this either
            await asyncio.wait_for(self.broker.check_schema(), 5.0)
        except SchemaError as schema:
            return Problem(503, str(schema))
        except Exception:  # the database is down: the first error tells it
            pass
        return Problem(503, f"the database did not answer: {describe(exc)} "
                            f"(database {self.broker.url})")


def endpoint(kind: Kind) -> Callable[[Endpoint], Callable[[Request], Awaitable[Response]]]:
    """Make ``fn(request, dashboard)`` a route that answers every failure in ``kind``'s
    form (see the module)."""

    def wrap(fn: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(fn)
        async def run(request: Request) -> Response:
            dash: Dashboard = request.app.state.dashboard
            try:
                return await fn(request, dash)
            except Problem as p:
                return dash.problem(request, kind, p.status, p.message)
            except ConfigurationError as exc:  # a queue name the broker refuses, say
                return dash.problem(request, kind, 400, str(exc))
            except (DBAPIError, OSError, TimeoutError, ConnectionError, SqlmqError) as exc:
                log.warning("dashboard: %s %s: database error", request.method,
                            request.url.path, exc_info=exc)
                p = await dash.diagnose(exc)
                return dash.problem(request, kind, p.status, p.message)
            except Exception as exc:
                log.exception("dashboard: %s %s failed", request.method, request.url.path)
                return dash.problem(request, kind, 500, f"the dashboard failed on this "
                                    f"request ({type(exc).__name__}); the traceback is in "
                                    "its log")

        return run

    return wrap


def _cookie_path(request: Request) -> str:
    return request.scope.get("root_path") or "/"


def _read_notice(request: Request) -> str | None:
    raw = request.cookies.get(NOTICE_COOKIE)
    if not raw:
        return None
    try:
        return base64.urlsafe_b64decode(raw.encode()).decode()[:500]
    except (ValueError, UnicodeDecodeError):
        return None


__all__ = ["Dashboard", "Kind", "endpoint"]
