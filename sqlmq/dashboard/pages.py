"""The dashboard's reading routes: pages, the fragments live pages refresh themselves with,
and the JSON behind them and the charts. Every figure comes from ``broker.insights()`` and
the Broker's operations API; a page costs the queries its insights call makes, whatever
the number of queues or rows shown.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..insights import QueueDetail
from ..records import PausedQueue
from ..views import ARCHIVED_STATES, DEAD_STATES, ArchiveQuery
from . import bulk, charts, live, views
from .context import Dashboard, endpoint
from .timeline import timeline
from .views import Problem

#: The queue page's throughput chart: the last hour, in buckets of two minutes.
CHART_SPAN = 3600.0
CHART_STEP = 120.0
#: The overview's chart and sparklines: the last hour, minute by minute.
OVERVIEW_STEP = 60.0


# ---- the queues overview -------------------------------------------------------------------


async def _overview(dash: Dashboard, *, drawn: bool = True) -> dict[str, Any]:
    """The overview's figures; ``drawn``: with its chart and sparklines too (one more read
    of the archive's last hour, for all queues at once)."""
    broker = dash.broker
    queues = await broker.insights().queues()
    paused = {p.queue: p for p in await broker.paused()}
    workers = await broker.workers()
    totals = {c: sum(getattr(q.stats, c) for q in queues) for c in views.COUNTS}
    totals["dead"] = totals["failed"] + totals["cancelled"]
    totals["done_1m"] = sum(q.activity["1m"].completed for q in queues)
    totals["failed_15m"] = sum(q.activity["15m"].failed for q in queues)
    found = {"queues": queues, "paused": paused, "workers": workers, "totals": totals,
             "idle_paused": sorted(set(paused) - {q.queue for q in queues})}
    if drawn:
        flows = await broker.insights().throughput_by_queue(
            [q.queue for q in queues], span=CHART_SPAN, step=OVERVIEW_STEP)
        found |= {"sparks": charts.sparklines(flows),
                  "chart": charts.throughput(charts.total(flows), OVERVIEW_STEP)}
    return found


@endpoint("page")
async def overview(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "overview.html", title="Queues", nav="queues",
                       **await _overview(dash))


@endpoint("fragment")
async def overview_fragment(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "_overview.html", **await _overview(dash))


@endpoint("json")
async def queues_json(request: Request, dash: Dashboard) -> Response:
    found = await _overview(dash, drawn=False)
    return JSONResponse([views.overview_json(q, found["paused"]) for q in found["queues"]])


# ---- one queue -----------------------------------------------------------------------------


async def _queue(request: Request, dash: Dashboard) -> dict[str, Any]:
    name = views.one(request.query_params, "name", required=True)
    assert name is not None
    broker = dash.broker
    detail = await broker.insights().queue(name)
    paused = {p.queue: p for p in await broker.paused()}
    if detail is None and name not in paused:
        known = [s.queue for s in await broker.stats()]
        shown = ", ".join(repr(q) for q in known[:20]) + (", …" if len(known) > 20 else "")
        raise Problem(404, f"no queue named {name!r} has messages, live or archived, and it "
                           f"is not paused (queues: {shown or 'none'})")
    return {"name": name, "detail": detail, "paused": paused, "pause": paused.get(name),
            "now": await broker.engine.now(), "dead_states": DEAD_STATES}


@endpoint("page")
async def queue(request: Request, dash: Dashboard) -> Response:
    found = await _queue(request, dash)
    return dash.render(request, "queue.html", title=found["name"], nav="queues", **found,
                       **await live.section(request, dash, found["name"]))


@endpoint("fragment")
async def queue_fragment(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "_queue.html", **await _queue(request, dash))


@endpoint("json")
async def queue_json(request: Request, dash: Dashboard) -> Response:
    found = await _queue(request, dash)
    detail: QueueDetail | None = found["detail"]
    if detail is None:  # paused, no message yet
        return JSONResponse({"queue": found["name"], "paused": True,
                             "paused_at": found["pause"].paused_at.isoformat()})
    return JSONResponse(views.detail_json(detail, found["paused"], found["now"]))


@endpoint("json")
async def queue_charts(request: Request, dash: Dashboard) -> Response:
    """The throughput of the last hour and the latency curve of ``name``."""
    name = views.one(request.query_params, "name", required=True)
    assert name is not None
    insights = dash.broker.insights()
    buckets = await insights.throughput(name, span=CHART_SPAN, step=CHART_STEP)
    curve = await insights.latency_percentiles(name)
    return JSONResponse(views.charts_json(buckets, CHART_STEP, curve))


# ---- the archive ---------------------------------------------------------------------------


async def _archive(request: Request, dash: Dashboard) -> tuple[ArchiveQuery, Any]:
    query = views.archive_query(request.query_params)
    return query, await dash.broker.insights().archive(query)


@endpoint("page")
async def archive(request: Request, dash: Dashboard) -> Response:
    query, page = await _archive(request, dash)
    dead = set(query.states or ()) == set(DEAD_STATES)
    return dash.render(
        request, "archive.html", title="Dead letters" if dead else "Archive",
        nav="dead" if dead else "archive", query=query, page=page,
        states=ARCHIVED_STATES,
        filters=views.archive_params(query),
        next_params=None if page.next is None else views.archive_params(page.next,
                                                                         next_page=True),
        deeper=query.after is not None, **await bulk.matching(dash, query))


@endpoint("json")
async def archive_json(request: Request, dash: Dashboard) -> Response:
    _, page = await _archive(request, dash)
    return JSONResponse({
        "items": [views.archived_json(v) for v in page.items],
        "next": None if page.next is None else dict(views.archive_params(page.next,
                                                                         next_page=True))})


# ---- one message ---------------------------------------------------------------------------


async def _message(request: Request, dash: Dashboard) -> Any:
    msg_id = views.message_id(request.path_params["msg_id"])
    view = await dash.broker.insights().message(msg_id)
    if view is None:
        raise Problem(404, f"no message {msg_id}: it is not waiting, running or archived "
                           "(it may have been purged)")
    return view


@endpoint("page")
async def message(request: Request, dash: Dashboard) -> Response:
    view = await _message(request, dash)
    return dash.render(request, "message.html", title=f"Message {view.id}", nav="",
                       msg=view, payload=views.payload(view.payload),
                       result=views.kept_result(view),
                       history=views.history_rows(view.history),
                       deliveries=timeline(view, await dash.broker.engine.now()),
                       dead=not view.live and view.state in DEAD_STATES)


@endpoint("page")
async def message_payload(request: Request, dash: Dashboard) -> Response:
    """The payload as stored, as a download (the page shows at most its start)."""
    view = await _message(request, dash)
    return Response(view.payload, media_type="application/octet-stream", headers={
        "content-disposition": f'attachment; filename="sqlmq-message-{view.id}.bin"'})


@endpoint("json")
async def message_json(request: Request, dash: Dashboard) -> Response:
    return JSONResponse((await _message(request, dash)).to_json())


# ---- workers and paused queues --------------------------------------------------------------


async def _workers(dash: Dashboard) -> dict[str, Any]:
    broker = dash.broker
    workers = await broker.workers()
    paused: list[PausedQueue] = await broker.paused()
    now: datetime = await broker.engine.now()
    return {"workers": workers, "paused_list": paused, "now": now}


@endpoint("page")
async def workers(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "workers.html", title="Workers", nav="workers",
                       **await _workers(dash))


@endpoint("fragment")
async def workers_fragment(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "_workers.html", **await _workers(dash))


@endpoint("json")
async def workers_json(request: Request, dash: Dashboard) -> Response:
    found = await _workers(dash)
    return JSONResponse([views.worker_json(w, found["now"]) for w in found["workers"]])


async def _paused(dash: Dashboard) -> dict[str, Any]:
    return {"paused_list": await dash.broker.paused(), "now": await dash.broker.engine.now()}


@endpoint("page")
async def paused(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "paused.html", title="Paused queues", nav="paused",
                       **await _paused(dash))


@endpoint("json")
async def paused_json(request: Request, dash: Dashboard) -> Response:
    found = await _paused(dash)
    return JSONResponse([views.paused_json(p, found["now"]) for p in found["paused_list"]])


routes = [
    Route("/", overview),
    Route("/partials/overview", overview_fragment),
    Route("/api/queues", queues_json),
    Route("/queue", queue),
    Route("/partials/queue", queue_fragment),
    Route("/api/queue", queue_json),
    Route("/api/queue/charts", queue_charts),
    Route("/archive", archive),
    Route("/api/archive", archive_json),
    Route("/messages/{msg_id}", message),
    Route("/messages/{msg_id}/payload", message_payload),
    Route("/api/messages/{msg_id}", message_json),
    Route("/workers", workers),
    Route("/partials/workers", workers_fragment),
    Route("/api/workers", workers_json),
    Route("/paused", paused),
    Route("/api/paused", paused_json),
]

__all__ = ["routes"]
