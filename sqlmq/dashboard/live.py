"""The queue page's live messages, filtered by what they wait on (:mod:`sqlmq.waits`): ready,
running, delayed, deferred by their handler, waiting for a signal or for other steps, or
asked to cancel. The page shows how many wait on each and a page of those chosen; the same
list is JSON at ``/api/queue/messages``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..views import MessageView
from ..waits import LiveQuery, Wait
from . import views
from .context import Dashboard, endpoint
from .views import Problem

#: The live messages a page shows.
PAGE_SIZE = 50

#: What each :class:`~sqlmq.waits.Wait` is called on the page, and what it means.
WAITS: dict[str, tuple[str, str]] = {
    Wait.READY: ("ready", "due: the next acquire may take it"),
    Wait.RUNNING: ("running", "a delivery holds it"),
    Wait.DELAYED: ("delayed", "due later: published with a delay, or a retry's backoff"),
    Wait.DEFERRED: ("deferred", "its handler deferred it; due when the defer asked"),
    Wait.SIGNAL: ("awaiting a signal", "deferred until a signal comes (or its time)"),
    Wait.STEPS: ("awaiting steps", "a workflow's step whose dependencies have not all ended"),
    Wait.CANCELLING: ("cancel asked", "ends CANCELLED unless its handler succeeds"),
}


def live_query(params: Any, queue: str) -> LiveQuery:
    """The live messages a query string asks for: ``waits`` (repeated or comma-separated),
    and ``after``, the last id of the page before."""
    waits: list[Wait] = []
    for raw in params.getlist("waits"):
        for word in raw.split(","):
            word = word.strip().lower()
            if not word:
                continue
            if word not in WAITS:
                raise Problem(400, f"waits: a live message waits on none of {word[:40]!r} "
                                   f"(waits: {', '.join(WAITS)})")
            if word not in waits:
                waits.append(Wait(word))
    after = views.one(params, "after")
    return LiveQuery(queue, tuple(waits) or None,
                     None if after is None else views.message_id(after), PAGE_SIZE)


async def section(request: Request, dash: Dashboard, queue: str) -> dict[str, Any]:
    """What the queue page's live messages section shows."""
    query = live_query(request.query_params, queue)
    insights = dash.broker.insights()
    return {"live": await insights.live(query), "live_query": query,
            "live_counts": await insights.waits(queue), "waits_shown": WAITS}


def live_json(v: MessageView, now: datetime) -> dict[str, Any]:
    """A row of the live list (the whole message is ``/api/messages/ID``)."""
    due = v.next_attempt_at
    return {"id": v.id, "state": v.state, "waits": v.waits, "waits_for": v.waits_for,
            "due_at": None if due is None else due.isoformat(),
            "due_in": None if due is None else (due - now).total_seconds(),
            "deliveries": v.deliveries, "attempts": v.attempts, "channel": v.channel,
            "created_at": v.created_at.isoformat(), "error": v.error}


@endpoint("json")
async def messages_json(request: Request, dash: Dashboard) -> Response:
    name = views.one(request.query_params, "name", required=True)
    assert name is not None
    query = live_query(request.query_params, name)
    page = await dash.broker.insights().live(query)
    now = await dash.broker.engine.now()
    return JSONResponse({"items": [live_json(v, now) for v in page.items],
                         "next": None if page.next is None else page.next.after})


routes = [Route("/api/queue/messages", messages_json)]

__all__ = ["PAGE_SIZE", "WAITS", "live_json", "live_query", "routes", "section"]
