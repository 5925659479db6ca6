"""The dashboard's writes: requeue a dead letter or all of a queue's, delete an archived
message, purge a queue's archive older than a duration, pause and resume a queue, cancel a
waiting message, send a signal to a live one. Each goes through the Broker's own API
(:mod:`sqlmq.operations`, :mod:`sqlmq.admin`, :mod:`sqlmq.workflows`), never SQL of its own.

Every write is a POST that must pass, in order: the dashboard is not read-only (403), the
form carries this process's anti-forgery token (403, see :mod:`.auth`), its fields are
valid (400), what it names exists and is in a state the write applies to (404, 409), and
it was confirmed. An unconfirmed POST (a browser without JavaScript, or a script) is
answered with a page that says exactly what will happen and asks again; the pages' own
script asks with the browser's confirm dialog instead and sends the confirmation along.
Once done, the browser is sent back (303) to the page it came from, which says what was
done, so a reload never repeats a write.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..views import ARCHIVED_STATES, DEAD_STATES, MessageView
from . import views
from .context import Dashboard, endpoint
from .views import Problem
from .writes import confirmation, form_of, next_page, quoted


async def _message(dash: Dashboard, form: FormData) -> MessageView:
    text = views.one(form, "id", required=True)
    assert text is not None
    view = await dash.broker.insights().message(views.message_id(text))
    if view is None:
        raise Problem(404, f"no message {text}: it is not waiting, running or archived (it "
                           "may have been deleted or purged meanwhile)")
    return view


def _queue(form: FormData) -> str:
    name = views.one(form, "queue", required=True)
    assert name is not None
    return name


@endpoint("page")
async def requeue(request: Request, dash: Dashboard) -> Response:
    """``id``: one dead letter; ``queue``: every dead letter of the queue."""
    form = await form_of(request, dash)
    broker = dash.broker
    if views.one(form, "id") is not None:
        view = await _message(dash, form)
        if view.live:
            raise Problem(409, f"message {view.id} is {view.state}, not archived: there is "
                               "nothing to requeue")
        if view.state not in DEAD_STATES:
            raise Problem(409, f"message {view.id} ended {view.state}, it is not a dead "
                               "letter: the dashboard requeues FAILED and CANCELLED messages")
        asked = confirmation(request, dash, form, f"Requeue message {view.id} ({view.state} "
                              f"in queue {view.queue!r}) as a fresh delivery? It runs again.",
                              "Requeue", danger=False)
        if asked is not None:
            return asked
        n = await broker.requeue(ids=[view.id])
        if n == 0:
            raise Problem(409, f"message {view.id} was requeued, deleted or purged "
                               "meanwhile: nothing done")
        return dash.done(request, next_page(request, form, f"/messages/{view.id}"),
                         f"Requeued message {view.id} to queue {view.queue!r}.")
    queue = _queue(form)
    stats = next((s for s in await broker.stats() if s.queue == queue), None)
    dead = 0 if stats is None else stats.failed + stats.cancelled
    asked = confirmation(request, dash, form, f"Requeue all {dead:,} dead letters (FAILED and "
                          f"CANCELLED) of queue {queue!r}? They all run again.",
                          f"Requeue {dead:,}", danger=dead > 0)
    if asked is not None:
        return asked
    n = await broker.requeue(queue=queue)
    return dash.done(request, next_page(request, form, f"/queue?name={quoted(queue)}"),
                     f"Requeued {n:,} dead letter(s) of queue {queue!r}.")


@endpoint("page")
async def delete(request: Request, dash: Dashboard) -> Response:
    form = await form_of(request, dash)
    view = await _message(dash, form)
    if view.live:
        raise Problem(409, f"message {view.id} is {view.state}, not archived: the dashboard "
                           "deletes archived messages only (cancel it instead)")
    asked = confirmation(request, dash, form, f"Delete archived message {view.id} "
                          f"({view.state} in queue {view.queue!r}) for good? This cannot be "
                          "undone.", "Delete")
    if asked is not None:
        return asked
    if not await dash.broker.delete(view.id):
        raise Problem(409, f"message {view.id} was deleted, requeued or purged meanwhile")
    # the message's own page is gone: back to the archive of its queue, unless elsewhere
    to = next_page(request, form, f"/archive?queue={quoted(view.queue)}")
    if to.split("?")[0].endswith(f"/messages/{view.id}"):
        to = request.scope.get("root_path", "") + f"/archive?queue={quoted(view.queue)}"
    return dash.done(request, to, f"Deleted archived message {view.id}.")


@endpoint("page")
async def purge(request: Request, dash: Dashboard) -> Response:
    form = await form_of(request, dash)
    queue = _queue(form)
    text = views.one(form, "older_than")
    age = views.duration("older_than", text)
    state = (views.one(form, "state") or "all").upper()
    if state != "ALL" and state not in ARCHIVED_STATES:
        raise Problem(400, f"state: no archived state {state[:40]!r} (states: all, "
                           f"{', '.join(ARCHIVED_STATES)})")
    states = ARCHIVED_STATES if state == "ALL" else (state,)
    which = "archived messages" if state == "ALL" else f"{state} messages"
    asked = confirmation(request, dash, form, f"Delete the {which} of queue {queue!r} "
                          f"archived more than {views.age(age.total_seconds())} ago? This "
                          "cannot be undone.", "Purge")
    if asked is not None:
        return asked
    n = await dash.broker.purge(older_than=age, queue=queue, states=states)
    return dash.done(request, next_page(request, form, f"/queue?name={quoted(queue)}"),
                     f"Purged {n:,} {which} of queue {queue!r} older than {text}.")


def _switch(verb: str, question: Callable[[str], str],
            said: Callable[[str, bool], str]) -> Any:
    @endpoint("page")
    async def run(request: Request, dash: Dashboard) -> Response:
        form = await form_of(request, dash)
        queue = _queue(form)
        asked = confirmation(request, dash, form, question(queue), verb.capitalize(),
                              danger=verb == "pause")
        if asked is not None:
            return asked
        changed = await getattr(dash.broker, verb)(queue)
        return dash.done(request, next_page(request, form, f"/queue?name={quoted(queue)}"),
                         said(queue, changed))

    run.__name__ = verb
    return run


pause = _switch(
    "pause", lambda q: f"Pause queue {q!r}? No process takes its messages until it is "
                       "resumed; publishing goes on and the messages wait.",
    lambda q, changed: f"Paused queue {q!r}." if changed else f"Queue {q!r} was paused "
                                                              "already.")
resume = _switch(
    "resume", lambda q: f"Resume queue {q!r}? Its messages are taken again at once.",
    lambda q, changed: f"Resumed queue {q!r}." if changed else f"Queue {q!r} was not paused.")


@endpoint("page")
async def cancel(request: Request, dash: Dashboard) -> Response:
    form = await form_of(request, dash)
    view = await _message(dash, form)
    if not view.live:
        raise Problem(409, f"message {view.id} has ended already ({view.state}): nothing to "
                           "cancel")
    running = view.state == "PROCESSING"
    asked = confirmation(
        request, dash, form, f"Cancel message {view.id} of queue {view.queue!r}? " + (
            "It is running: its handler is asked to stop, and unless it succeeds it ends "
            "CANCELLED." if running else "It is archived CANCELLED and never runs."),
        "Cancel message")
    if asked is not None:
        return asked
    found = await dash.broker.cancel(view.id)
    return dash.done(request, next_page(request, form, f"/messages/{view.id}"),
                     str(found).capitalize() + ".")


@endpoint("page")
async def signal(request: Request, dash: Dashboard) -> Response:
    """``id``, ``name`` and an optional JSON ``payload``: ``Broker.signal`` (see
    :mod:`sqlmq.workflows`)."""
    form = await form_of(request, dash)
    view = await _message(dash, form)
    name = views.one(form, "name", required=True)
    assert name is not None
    text = views.one(form, "payload")
    try:
        payload = None if not text else json.loads(text)
    except ValueError as exc:
        raise Problem(400, f"payload: not JSON ({exc})") from None
    if not view.live:
        raise Problem(409, f"message {view.id} has ended already ({view.state}): a signal "
                           "would wake nothing")
    asked = confirmation(request, dash, form, f"Send signal {name!r} to message {view.id} "
                          f"of queue {view.queue!r}? If it waits for it, it runs at once.",
                          "Send signal", danger=False)
    if asked is not None:
        return asked
    if not await dash.broker.signal(view.id, name, payload):
        raise Problem(409, f"message {view.id} ended meanwhile: signal {name!r} not kept")
    return dash.done(request, next_page(request, form, f"/messages/{view.id}"),
                     f"Sent signal {name!r} to message {view.id}.")


routes = [
    Route("/actions/requeue", requeue, methods=["POST"]),
    Route("/actions/delete", delete, methods=["POST"]),
    Route("/actions/purge", purge, methods=["POST"]),
    Route("/actions/pause", pause, methods=["POST"]),
    Route("/actions/resume", resume, methods=["POST"]),
    Route("/actions/cancel", cancel, methods=["POST"]),
    Route("/actions/signal", signal, methods=["POST"]),
]

__all__ = ["routes"]
