"""The search box of every page: a message id opens that message, live or archived;
words list the archived messages whose header values or error have them
(:meth:`sqlmq.Insights.search`, read through each database's text index). This module's
routes and its template, ``search.html``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..search import SearchResult
from . import views
from .context import Dashboard, endpoint
from .views import Problem

#: A page of results.
SHOWN = 50


async def _search(request: Request, dash: Dashboard) -> SearchResult:
    text = views.one(request.query_params, "q", required=True)
    assert text is not None
    before_text = views.one(request.query_params, "before")
    before = None if before_text is None else views.message_id(before_text)
    try:
        return await dash.broker.insights().search(text, limit=SHOWN, before=before)
    except ValueError as exc:
        raise Problem(400, f"q: {exc}") from None


@endpoint("page")
async def search(request: Request, dash: Dashboard) -> Response:
    found = await _search(request, dash)
    if found.message is not None:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/messages/"
                                f"{found.message.id}", status_code=303)
    missing = found.id is not None and "before" not in request.query_params
    return dash.render(request, "search.html", title=f"Search: {found.text[:60]}", nav="",
                       found=found, missing=missing, search_text=found.text,
                       next_params=_next(found),
                       status_code=404 if missing and not found.items else 200)


@endpoint("json")
async def search_json(request: Request, dash: Dashboard) -> Response:
    found = await _search(request, dash)
    return JSONResponse({
        "text": found.text, "id": found.id,
        "message": None if found.message is None else found.message.to_json(),
        "words": found.words,
        "items": [views.archived_json(v) | {"headers": v.headers} for v in found.items],
        "next": _next(found)})


def _next(found: SearchResult) -> dict[str, Any] | None:
    """The query string of the next page of results (None: this was the last)."""
    return None if found.next is None else {"q": found.text, "before": str(found.next)}


routes = [
    Route("/search", search),
    Route("/api/search", search_json),
]

__all__ = ["SHOWN", "routes"]
