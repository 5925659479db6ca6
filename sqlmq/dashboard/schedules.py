"""The dashboard's schedules page (see :mod:`sqlmq.schedules`): every periodic schedule the
database knows, with its cadence, time zone, catch-up policy, last and next tick and the
message its last tick published; and the writes that pause and resume one. A page of its
own: this module's routes and its template.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import UnknownSchedule
from ..schedules import ScheduleInfo
from . import views
from .context import Dashboard, endpoint
from .views import Problem
from .writes import confirmation, form_of, next_page


def schedule_json(s: ScheduleInfo, now: datetime) -> dict[str, Any]:
    tick = views.next_tick(s, now)
    return {"name": s.name, "queue": s.queue, "cron": s.cadence.cron,
            "every_seconds": s.cadence.every, "tz": s.cadence.tz,
            "cadence": s.cadence.describe(), "catch_up": s.catch_up,
            "registered_at": s.registered_at.isoformat(),
            "last_tick_at": s.last_tick_at and s.last_tick_at.isoformat(),
            "last_message_id": s.last_message_id,
            "next_tick_at": tick and tick.isoformat(),
            "paused_at": s.paused_at and s.paused_at.isoformat()}


async def _schedules(dash: Dashboard) -> dict[str, Any]:
    return {"found": await dash.broker.schedules(), "now": await dash.broker.engine.now()}


@endpoint("page")
async def schedules(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "schedules.html", title="Schedules", nav="schedules",
                       **await _schedules(dash))


@endpoint("fragment")
async def schedules_fragment(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "_schedules.html", **await _schedules(dash))


@endpoint("json")
async def schedules_json(request: Request, dash: Dashboard) -> Response:
    found = await _schedules(dash)
    return JSONResponse([schedule_json(s, found["now"]) for s in found["found"]])


def _switch(paused: bool) -> Any:
    verb = "pause" if paused else "resume"

    @endpoint("page")
    async def run(request: Request, dash: Dashboard) -> Response:
        form = await form_of(request, dash)
        name = views.one(form, "name", required=True)
        assert name is not None
        known = {s.name: s for s in await dash.broker.schedules()}
        if name not in known:
            shown = ", ".join(repr(n) for n in known) or "none"
            raise Problem(404, f"no schedule named {name!r} (schedules: {shown})")
        s = known[name]
        question = (f"Pause schedule {name!r} ({s.cadence.describe()}, to queue {s.queue!r})? "
                    "No process publishes its ticks until it is resumed." if paused else
                    f"Resume schedule {name!r} ({s.cadence.describe()}, to queue "
                    f"{s.queue!r})? The ticks it missed follow its catch-up "
                    f"({s.catch_up!r}).")
        asked = confirmation(request, dash, form, question, verb.capitalize(), danger=paused)
        if asked is not None:
            return asked
        try:
            changed = await getattr(dash.broker, f"{verb}_schedule")(name)
        except UnknownSchedule as exc:  # deleted meanwhile
            raise Problem(404, str(exc)) from None
        said = (f"{verb.capitalize()}d schedule {name!r}." if changed else
                f"Schedule {name!r} was {'paused already' if paused else 'not paused'}.")
        return dash.done(request, next_page(request, form, "/schedules"), said)

    run.__name__ = f"{verb}_schedule"
    return run


pause = _switch(True)
resume = _switch(False)

routes = [
    Route("/schedules", schedules),
    Route("/partials/schedules", schedules_fragment),
    Route("/api/schedules", schedules_json),
    Route("/actions/schedule/pause", pause, methods=["POST"]),
    Route("/actions/schedule/resume", resume, methods=["POST"]),
]

__all__ = ["routes", "schedule_json"]
