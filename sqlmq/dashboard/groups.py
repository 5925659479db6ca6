"""The dashboard's topics page (see :mod:`sqlmq.topics`): every consumer group with its
topic pattern, its queue, what waits and runs there and how fast it is served; and the
write that deletes a group. A page of its own: this module's routes and its template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import UnknownGroup
from ..insights import WINDOWS, QueueOverview
from ..topics import TopicGroup
from . import views
from .context import Dashboard, endpoint
from .views import Problem
from .writes import confirmation, form_of, next_page


@dataclass(frozen=True)
class GroupRow:
    """A consumer group beside the overview of its queue (None: no message there yet)."""

    group: TopicGroup
    queue: QueueOverview | None

    @property
    def waiting(self) -> int:
        return 0 if self.queue is None else self.queue.stats.pending + self.queue.stats.retryable

    @property
    def running(self) -> int:
        return 0 if self.queue is None else self.queue.stats.processing


def group_json(r: GroupRow) -> dict[str, Any]:
    q = r.queue
    return {"pattern": r.group.pattern, "group": r.group.group, "queue": r.group.queue,
            "created_at": r.group.created_at.isoformat(), "waiting": r.waiting,
            "running": r.running, "oldest_ready_age": q and q.oldest_ready_age,
            "completed_per_minute": {w: (q.activity[w].completed if q else 0)
                                     / WINDOWS[w] * 60 for w in WINDOWS},
            "failed_1h": q.activity["1h"].failed if q else 0}


async def _groups(dash: Dashboard) -> list[GroupRow]:
    queues = {q.queue: q for q in await dash.broker.insights().queues()}
    return [GroupRow(g, queues.get(g.queue)) for g in await dash.broker.groups()]


@endpoint("page")
async def groups(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "groups.html", title="Topics", nav="groups",
                       rows=await _groups(dash))


@endpoint("fragment")
async def groups_fragment(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "_groups.html", rows=await _groups(dash))


@endpoint("json")
async def groups_json(request: Request, dash: Dashboard) -> Response:
    return JSONResponse([group_json(r) for r in await _groups(dash)])


@endpoint("page")
async def delete_group(request: Request, dash: Dashboard) -> Response:
    """``pattern`` and ``group``: ``Broker.delete_group``."""
    form = await form_of(request, dash)
    pattern = views.one(form, "pattern", required=True)
    name = views.one(form, "group", required=True)
    assert pattern is not None and name is not None
    row = next((r for r in await _groups(dash)
                if (r.group.pattern, r.group.group) == (pattern, name)), None)
    if row is None:
        raise Problem(404, f"no consumer group {name!r} of topic {pattern!r}")
    live = row.waiting + row.running
    asked = confirmation(request, dash, form, f"Delete consumer group {name!r} of topic "
                          f"{pattern!r}? Its queue {row.group.queue!r} gets no more copies, "
                          f"and its {live:,} waiting or running message(s) are deleted (the "
                          "archive keeps its history). A subscriber of the group that starts "
                          "again makes it anew.", "Delete group")
    if asked is not None:
        return asked
    try:
        removed = await dash.broker.delete_group(pattern, name)
    except UnknownGroup as exc:  # deleted meanwhile
        raise Problem(404, str(exc)) from None
    return dash.done(request, next_page(request, form, "/groups"),
                     f"Deleted consumer group {name!r} of {pattern!r} and {removed:,} "
                     "message(s) of its queue.")


routes = [
    Route("/groups", groups),
    Route("/partials/groups", groups_fragment),
    Route("/api/groups", groups_json),
    Route("/actions/group/delete", delete_group, methods=["POST"]),
]

__all__ = ["GroupRow", "group_json", "routes"]
