"""Bulk repairs of the archive from the dashboard: requeue or delete the archived messages
ticked on a page of the archive browser, or every one its filter matches.

A selection (at most a few pages of ids) is checked and done in the request, as the other
writes are. A filter may match 100,000 rows: it is counted for the confirmation, then moved
by a job of the server (:mod:`.jobs`) in batches of :data:`BATCH` rows, one transaction
each (:meth:`sqlmq.Broker.requeue` and :meth:`~sqlmq.Broker.purge` with ``matching``),
whose page shows its progress and its exact count. What the filter matches is pinned when
it is counted (``upto``): a message archived later, one that a requeued message's new
failure archives again included, is not taken.

Both are writes as :mod:`.actions` has them: a POST, refused read-only (403) or without the
anti-forgery field (403), checked (400 for a bad field, an empty selection or an unknown
id; 409 for a message in a state the repair does not apply to), and confirmed with the
count in the question.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..errors import ChannelFull
from ..views import ARCHIVED_STATES, DEAD_STATES, ArchiveQuery
from . import views
from .context import Dashboard, endpoint
from .jobs import Job
from .views import Problem
from .writes import confirmation, form_of, next_page

#: Rows a job moves per transaction: a few tenths of a second each, so the page's progress
#: moves and no lock is held long.
BATCH = 500
#: Ids one form may tick (the archive browser shows at most 500 a page).
MAX_SELECTED = 1_000
#: The archive browser counts what its filter matches up to this many ("100,000+" above).
COUNTED = 100_000

ACTIONS = ("requeue", "delete")


async def matching(dash: Dashboard, query: ArchiveQuery) -> dict[str, Any]:
    """What the archive browser says of its filter's matches: how many (up to
    :data:`COUNTED`), for its "select all matching" choice."""
    n = await dash.broker.insights().archive_count(query, most=COUNTED + 1)
    return {"matching": min(n, COUNTED), "matching_more": n > COUNTED,
            "can_requeue": not query.states or any(s in DEAD_STATES for s in query.states)}


@endpoint("page")
async def bulk(request: Request, dash: Dashboard) -> Response:
    """``repair`` (requeue or delete) of the ``id`` fields (``scope=ids``) or of every
    archived message the filter fields match (``scope=filter``: ``queue``, ``state``,
    ``error``, ``from``, ``to``, as the archive browser's query string)."""
    form = await form_of(request, dash)
    action = views.one(form, "repair", required=True)
    assert action is not None
    if action not in ACTIONS:
        raise Problem(400, f"repair: {action[:40]!r} is not a bulk repair (requeue or "
                           "delete)")
    scope = views.one(form, "scope") or "ids"
    if scope == "ids":
        return await _selected(request, dash, form, action)
    if scope == "filter":
        return await _matching(request, dash, form, action)
    raise Problem(400, f"scope: {scope[:40]!r} is neither ids (the ticked rows) nor filter "
                       "(every match)")


async def _selected(request: Request, dash: Dashboard, form: FormData,
                    action: str) -> Response:
    texts = [t.strip() for t in form.getlist("id") if isinstance(t, str) and t.strip()]
    if not texts:
        raise Problem(400, "no message selected: tick the rows to act on, or select all "
                           "that match the filter")
    if len(texts) > MAX_SELECTED:
        raise Problem(400, f"{len(texts):,} messages selected: at most {MAX_SELECTED:,} at "
                           "a time (select all that match the filter instead)")
    ids = list(dict.fromkeys(views.message_id(t) for t in texts))
    states = await dash.broker.insights().states(ids)
    unknown = [i for i in ids if i not in states]
    if unknown:
        raise Problem(400, f"no message {_listed(unknown)}: it is not waiting, running or "
                           "archived (deleted, requeued or purged meanwhile?); nothing done")
    live = [i for i in ids if states[i] not in ARCHIVED_STATES]
    if live:
        raise Problem(409, f"message {_listed(live)} is {states[live[0]]}, not archived: "
                           "the bulk repairs apply to archived messages; nothing done")
    n = len(ids)
    if action == "requeue":
        ended = [i for i in ids if states[i] not in DEAD_STATES]
        if ended:
            raise Problem(409, f"message {_listed(ended)} ended {states[ended[0]]}, not a "
                               "dead letter: the dashboard requeues FAILED and CANCELLED "
                               "messages; nothing done")
        question = (f"Requeue {_count(n, 'selected dead letter')} ({_listed(ids)}) as fresh "
                    "deliveries? They run again.")
        asked = confirmation(request, dash, form, question, f"Requeue {n:,}", danger=False)
    else:
        question = (f"Delete {_count(n, 'selected archived message')} ({_listed(ids)}) for "
                    "good? This cannot be undone.")
        asked = confirmation(request, dash, form, question, f"Delete {n:,}")
    if asked is not None:
        return asked
    back = next_page(request, form, "/archive")
    if action == "requeue":
        try:
            done = await dash.broker.requeue(ids=ids, batch=BATCH)
        except ChannelFull as exc:  # a channel's max_size: that batch moved nothing
            raise Problem(409, str(exc)) from None
        said = f"Requeued {_count(done, 'dead letter')} of the {n:,} selected"
    else:
        done = await dash.broker.purge(ids=ids)
        said = f"Deleted {_count(done, 'archived message')} of the {n:,} selected"
    gone = "" if done == n else " (the others were requeued, deleted or purged meanwhile)"
    return dash.done(request, back, f"{said}{gone}.")


async def _matching(request: Request, dash: Dashboard, form: FormData,
                    action: str) -> Response:
    query = replace(views.archive_query(form), after=None)
    noun = "archived message"
    if action == "requeue":
        noun = "dead letter"
        dead = tuple(s for s in query.states or DEAD_STATES if s in DEAD_STATES)
        if not dead:
            raise Problem(400, f"the filter's states ({', '.join(query.states or ())}) hold "
                               "no dead letter: a requeue applies to FAILED and CANCELLED "
                               "messages")
        query = replace(query, states=dead)
    text = views.one(form, "upto")
    upto = views.moment("upto", text) if text else await dash.broker.engine.now()
    pinned = replace(query, archived_to=upto if query.archived_to is None
                     else min(query.archived_to, upto))
    _one_at_a_time(request, dash)
    n = await dash.broker.insights().archive_count(pinned)
    words = filter_words(query)
    if n == 0:
        raise Problem(409, f"no {noun} {words} (anymore): nothing to {action}")
    title = f"{action.capitalize()} {_count(n, noun)} {words}"
    if text is None:
        form = FormData([*form.multi_items(), ("upto", upto.isoformat())])
    asked = confirmation(
        request, dash, form, f"{title}? " + ("They all run again." if action == "requeue"
                                             else "This cannot be undone."),
        f"{action.capitalize()} {n:,}", danger=action == "delete")
    if asked is not None:
        return asked
    _one_at_a_time(request, dash)
    past = "Requeued" if action == "requeue" else "Deleted"

    def said(done: int) -> str:
        gone = ("" if done >= n else f" ({n:,} were counted; the others were requeued, "
                "deleted or purged meanwhile)")
        return f"{past} {_count(done, noun)} {words}{gone}."

    repair = dash.broker.requeue if action == "requeue" else dash.broker.purge
    job = dash.jobs.start(action, title, n, next_page(request, form, "/archive"),
                          lambda progress: repair(matching=pinned, batch=BATCH,
                                                  progress=progress), said)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/operations/{job.id}",
                            status_code=303)


def _one_at_a_time(request: Request, dash: Dashboard) -> None:
    running = dash.jobs.running()
    if running is not None:
        raise Problem(409, f"another bulk repair is running ({running.title}: "
                           f"{running.done:,} of {running.total:,} done, see "
                           f"{request.scope.get('root_path', '')}/operations/{running.id}); "
                           "try again once it is done")


def filter_words(query: ArchiveQuery) -> str:
    """``of queue 'orders' matching state FAILED, error containing 'gateway'``: what a
    filter takes, as a confirmation says it."""
    where = "of every queue" if query.queue is None else f"of queue {query.queue!r}"
    parts = []
    if query.states and set(query.states) != set(ARCHIVED_STATES):
        parts.append("state " + " or ".join(query.states))
    if query.error_contains:
        parts.append(f"error containing {query.error_contains!r}")
    if query.archived_from is not None:
        parts.append(f"archived from {views.when(query.archived_from)} UTC")
    if query.archived_to is not None:
        parts.append(f"archived before {views.when(query.archived_to)} UTC")
    return where + (" matching " + ", ".join(parts) if parts else "")


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _listed(ids: list[int], most: int = 10) -> str:
    shown = ", ".join(str(i) for i in ids[:most])
    more = f" and {len(ids) - most:,} more" if len(ids) > most else ""
    return shown + more


def _job(request: Request, dash: Dashboard) -> Job:
    job_id = request.path_params["job_id"]
    job = dash.jobs.get(job_id)
    if job is None:
        raise Problem(404, f"no bulk repair {job_id[:40]!r}: the dashboard keeps its last "
                           "ones until it restarts")
    return job


@endpoint("page")
async def operation(request: Request, dash: Dashboard) -> Response:
    """A job's page: its progress while it runs, then its result (the page's script follows
    :func:`operation_json`; without it, the page reloads itself)."""
    job = _job(request, dash)
    return dash.render(request, "operation.html", title=job.title, nav="", job=job,
                       started=datetime.fromtimestamp(job.started_at, UTC))


@endpoint("json")
async def operation_json(request: Request, dash: Dashboard) -> Response:
    return JSONResponse(_job(request, dash).to_json())


routes = [
    Route("/actions/bulk", bulk, methods=["POST"]),
    Route("/operations/{job_id}", operation),
    Route("/api/operations/{job_id}", operation_json),
]

__all__ = ["BATCH", "COUNTED", "MAX_SELECTED", "filter_words", "matching", "routes"]
