"""Who may use the dashboard, and how a write is told from a forged one.

**Token.** With a token, every request needs it, pages, JSON and static files alike: an
``Authorization: Bearer TOKEN`` header (scripts), or a cookie the browser got by opening
any page once with ``?token=TOKEN`` (a GET; the forms of the pages then send the cookie).
That first request is answered with a redirect to the same address without the token, so
it does not stay in the address bar, the history or a ``Referer``; the cookie is HttpOnly
(no script reads it) and SameSite=Strict (no other site's page sends it) and holds a
digest of the token, not the token. Without it: 401. Tokens are compared in constant
time.

**Forged writes (CSRF).** Every write is a POST whose form carries the dashboard's
per-process token (a hidden field of the page that offered it): another site's page
cannot read it, so cannot forge the form. It changes when the dashboard restarts (a page
opened before that asks to be reloaded).

**Headers.** Every answer forbids framing (no clickjacking of a confirm button), scripts
and styles from anywhere but the dashboard (no inline script runs), MIME sniffing, and
caching (the figures are live and may be confidential).
"""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import URL, MutableHeaders
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE = "sqlmq_dashboard"
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class TokenGate:
    """Refuse (401) every request that does not carry ``token`` (see the module)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token
        # The cookie proves the token was given once; it is not the token itself.
        self.cookie = hmac.new(token.encode(), b"sqlmq dashboard cookie",
                               hashlib.sha256).hexdigest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        if ((scheme.lower() == "bearer" and same(bearer.strip(), self.token))
                or same(request.cookies.get(COOKIE), self.cookie)):
            await self.app(scope, receive, send)
            return
        given = request.query_params.get("token")
        if given is not None and same(given, self.token) and request.method in ("GET", "HEAD"):
            response = RedirectResponse(_without_token(request.url), status_code=303)
            response.set_cookie(COOKIE, self.cookie, httponly=True, samesite="strict",
                                secure=request.url.scheme == "https",
                                path=scope.get("root_path") or "/")
            await response(scope, receive, send)
            return
        await refused(request, "wrong token" if given is not None or bearer else None)(
            scope, receive, send)


def _without_token(url: URL) -> str:
    """The path and query string of ``url`` less ``token``: a relative redirect, so a forged
    Host header cannot send the browser elsewhere."""
    kept = [(k, v) for k, v in parse_qsl(url.query, keep_blank_values=True) if k != "token"]
    return url.path + (f"?{urlencode(kept)}" if kept else "")


def refused(request: Request, why: str | None) -> Response:
    text = ("This dashboard needs its token: open it once with ?token=… in the address "
            "(it is then kept in a cookie), or send the header Authorization: Bearer …")
    if why:
        text = f"{why}. {text}"
    headers = {"www-authenticate": 'Bearer realm="sqlmq dashboard"'}
    if request.url.path.rstrip("/").endswith("/api") or "/api/" in request.url.path:
        return JSONResponse({"error": text, "status": 401}, 401, headers=headers)
    return HTMLResponse(
        "<!doctype html><html lang=en><meta charset=utf-8><title>401 · sqlmq dashboard</title>"
        f"<h1>401 Unauthorized</h1><p>{html.escape(text)}</p></html>", 401, headers=headers)


class SecurityHeaders:
    """Add :data:`SECURITY_HEADERS` to every answer (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def add(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for key, value in SECURITY_HEADERS.items():
                    if key not in headers:
                        headers[key] = value
            await send(message)

        await self.app(scope, receive, add)


def check_csrf(form: Any, expected: str) -> str | None:
    """Why the form of a write is refused (None: it carries the dashboard's token)."""
    if same(form.get("csrf"), expected):
        return None
    if form.get("csrf"):
        return ("this form is from before the dashboard restarted (or from another "
                "dashboard): reload the page and try again")
    return "the form lacks the dashboard's anti-forgery field: use the dashboard's own pages"


__all__ = ["COOKIE", "SECURITY_HEADERS", "SecurityHeaders", "TokenGate", "check_csrf",
           "new_secret", "refused", "same"]
