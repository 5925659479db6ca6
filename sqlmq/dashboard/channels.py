"""The dashboard's channel pages (see :mod:`sqlmq.channels`): every channel by queue, with
its limits (its own, or its queue's default), what waits and runs in it, how fast it is
served and how long its oldest message has waited; one channel with its live messages;
and the writes that set or reset a channel's limits and a queue's default. A page of its
own: this module's routes and its templates.

A limit set here is the one ``Broker.set_channel`` writes: every process applies it from
its next acquire, with no restart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..channels import ChannelInfo, ChannelSettings, check_channel
from ..errors import ConfigurationError
from ..insights import ChannelOverview
from ..subscriber import check_queue
from . import views
from .context import Dashboard, endpoint
from .views import Problem
from .writes import confirmation, form_of, next_page, quoted

#: How the channels page may sort each queue's channels (``?sort=``), and by what.
SORTS = {"name": lambda o: o.info.name, "waiting": lambda o: (-o.info.waiting, o.info.name),
         "running": lambda o: (-o.info.running, o.info.name)}
#: How many of a channel's live messages its page lists.
LISTED = 100
#: The limit fields of a form, as ``ChannelSettings`` names them.
LIMITS = ("max_concurrency", "rate", "ordered", "max_size")


def describe(s: ChannelSettings | None) -> str:
    """A channel's limits in words, as a confirmation and a table name them."""
    if s is None:
        return "none"
    parts = [f"max concurrency {s.max_concurrency}" if s.max_concurrency is not None else "",
             f"rate {s.rate:g}/s" if s.rate is not None else "", "ordered" if s.ordered else "",
             f"max size {s.max_size}" if s.max_size is not None else ""]
    return ", ".join(p for p in parts if p) or "no limits"


def limits_json(s: ChannelSettings | None) -> dict[str, Any] | None:
    return None if s is None else {"max_concurrency": s.max_concurrency, "rate": s.rate,
                                   "ordered": s.ordered, "max_size": s.max_size}


def _channel_json(o: ChannelOverview) -> dict[str, Any]:
    c = o.info
    return {"name": c.name, "queue": c.queue, "own": limits_json(c.settings),
            "queue_default": limits_json(o.default), "effective": limits_json(c.effective),
            "waiting": c.waiting, "running": c.running, "served_per_second": o.served_rate,
            "oldest_ready_age": o.oldest_ready_age,
            "last_served_at": c.last_served_at and c.last_served_at.isoformat()}


# ---- reading --------------------------------------------------------------------------------


async def _channels(request: Request, dash: Dashboard) -> dict[str, Any]:
    sort = views.one(request.query_params, "sort") or "name"
    if sort not in SORTS:
        raise Problem(400, f"sort: {sort[:40]!r} is not one of {', '.join(SORTS)}")
    found = await dash.broker.insights().channels()
    defaults = await dash.broker.channel_defaults()
    by_queue: dict[str, list[ChannelOverview]] = {q: [] for q in defaults}
    for o in found:
        by_queue.setdefault(o.info.queue, []).append(o)
    for listed in by_queue.values():
        listed.sort(key=SORTS[sort])
    return {"sort": sort, "found": found, "defaults": defaults,
            "by_queue": dict(sorted(by_queue.items()))}


@endpoint("page")
async def channels(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "channels.html", title="Channels", nav="channels",
                       describe=describe, **await _channels(request, dash))


@endpoint("fragment")
async def channels_fragment(request: Request, dash: Dashboard) -> Response:
    return dash.render(request, "_channels.html", describe=describe,
                       **await _channels(request, dash))


@endpoint("json")
async def channels_json(request: Request, dash: Dashboard) -> Response:
    found = await _channels(request, dash)
    return JSONResponse({
        "channels": [_channel_json(o) for q in found["by_queue"].values() for o in q],
        "queue_defaults": {q: limits_json(s) for q, s in found["defaults"].items()}})


async def _known(dash: Dashboard, name: str) -> ChannelOverview:
    found = {o.info.name: o for o in await dash.broker.insights().channels()}
    if name not in found:
        shown = ", ".join(repr(n) for n in list(found)[:20]) + (", …" if len(found) > 20 else "")
        raise Problem(404, f"no channel named {name!r} (channels: {shown or 'none'}); a "
                           "channel is made by its first publish")
    return found[name]


async def _channel(request: Request, dash: Dashboard) -> dict[str, Any]:
    name = views.one(request.query_params, "name", required=True)
    assert name is not None
    overview = await _known(dash, name)
    return {"o": overview, "c": overview.info,
            "messages": await dash.broker.insights().channel_messages(name, LISTED)}


@endpoint("page")
async def channel(request: Request, dash: Dashboard) -> Response:
    found = await _channel(request, dash)
    shown: ChannelInfo = found["c"]
    return dash.render(request, "channel.html", title=f"Channel {shown.name}", nav="channels",
                       describe=describe, listed=LISTED, **found)


@endpoint("json")
async def channel_json(request: Request, dash: Dashboard) -> Response:
    found = await _channel(request, dash)
    return JSONResponse({**_channel_json(found["o"]),
                         "messages": [v.to_json() for v in found["messages"]]})


# ---- writing --------------------------------------------------------------------------------


def _whole(form: Mapping[str, Any], name: str) -> int | None:
    text = views.one(form, name)
    if text is None or not text.strip():
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise Problem(400, f"{name}: {text[:40]!r} is not a whole number (leave it empty "
                           "for no limit)") from None
    if value < 1:
        raise Problem(400, f"{name}: {value} is below 1 (leave it empty for no limit)")
    return value


def _rate(form: Mapping[str, Any]) -> float | None:
    text = views.one(form, "rate")
    if text is None or not text.strip():
        return None
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise Problem(400, f"rate: {text[:40]!r} is not a positive number of starts per "
                           "second (leave it empty for no limit)")
    return value


def _ordered(form: Mapping[str, Any]) -> bool:
    text = (views.one(form, "ordered") or "no").strip().lower()
    if text not in ("yes", "no", "1", "0", "true", "false", "on", "off"):
        raise Problem(400, f"ordered: {text[:40]!r} is not yes or no")
    return text in ("yes", "1", "true", "on")


def limits_of(form: FormData) -> ChannelSettings:
    """The limits a form asks for, each field checked (a 400 names the first bad one)."""
    return ChannelSettings(_whole(form, "max_concurrency"), _rate(form), _ordered(form),
                           _whole(form, "max_size"))


def _name(form: FormData, field: str) -> str:
    text = views.one(form, field, required=True)
    assert text is not None
    try:
        return check_channel(text) if field == "channel" else check_queue(text)
    except ConfigurationError as exc:
        raise Problem(400, f"{field}: {exc}") from None


@endpoint("page")
async def set_limits(request: Request, dash: Dashboard) -> Response:
    """``channel`` and its limits: ``Broker.set_channel``."""
    form = await form_of(request, dash)
    name = _name(form, "channel")
    limits = limits_of(form)
    found = await _known(dash, name)
    asked = confirmation(request, dash, form, f"Set the limits of channel {name!r} (queue "
                          f"{found.info.queue!r}) to: {describe(limits)}? Every process "
                          f"applies them from its next acquire (now: "
                          f"{describe(found.info.effective)}).", "Set limits", danger=False)
    if asked is not None:
        return asked
    s = limits
    await dash.broker.set_channel(name, max_concurrency=s.max_concurrency, rate=s.rate,
                                  ordered=s.ordered, max_size=s.max_size)
    return dash.done(request, next_page(request, form, f"/channel?name={quoted(name)}"),
                     f"Channel {name!r}: {describe(limits)}.")


@endpoint("page")
async def reset_limits(request: Request, dash: Dashboard) -> Response:
    """``channel``: ``Broker.reset_channel`` (it takes its queue's default again)."""
    form = await form_of(request, dash)
    name = _name(form, "channel")
    found = await _known(dash, name)
    if found.info.settings is None:
        raise Problem(409, f"channel {name!r} has no limits of its own: it takes its queue's "
                           "default already")
    asked = confirmation(request, dash, form, f"Reset channel {name!r}: drop its own limits "
                          f"({describe(found.info.settings)}) so that it takes queue "
                          f"{found.info.queue!r}'s default ({describe(found.default)})?",
                          "Reset limits")
    if asked is not None:
        return asked
    await dash.broker.reset_channel(name)
    return dash.done(request, next_page(request, form, f"/channel?name={quoted(name)}"),
                     f"Channel {name!r} takes queue {found.info.queue!r}'s default again.")


@endpoint("page")
async def set_default(request: Request, dash: Dashboard) -> Response:
    """``queue`` and limits: ``Broker.set_channel_default``."""
    form = await form_of(request, dash)
    queue = _name(form, "queue")
    limits = limits_of(form)
    asked = confirmation(request, dash, form, f"Set the default limits of queue {queue!r}'s "
                          f"channels to: {describe(limits)}? Its channels without limits of "
                          "their own take them from every process's next acquire.",
                          "Set default", danger=False)
    if asked is not None:
        return asked
    s = limits
    await dash.broker.set_channel_default(queue, max_concurrency=s.max_concurrency,
                                          rate=s.rate, ordered=s.ordered, max_size=s.max_size)
    return dash.done(request, next_page(request, form, "/channels"),
                     f"Queue {queue!r}'s channel default: {describe(limits)}.")


@endpoint("page")
async def reset_default(request: Request, dash: Dashboard) -> Response:
    """``queue``: ``Broker.reset_channel_default``."""
    form = await form_of(request, dash)
    queue = _name(form, "queue")
    default = (await dash.broker.channel_defaults()).get(queue)
    if default is None:
        raise Problem(409, f"queue {queue!r} has no channel default: nothing to reset")
    asked = confirmation(request, dash, form, f"Remove queue {queue!r}'s channel default "
                          f"({describe(default)})? Its channels without limits of their own "
                          "then have none.", "Remove default")
    if asked is not None:
        return asked
    await dash.broker.reset_channel_default(queue)
    return dash.done(request, next_page(request, form, "/channels"),
                     f"Queue {queue!r} has no channel default now.")


routes = [
    Route("/channels", channels),
    Route("/partials/channels", channels_fragment),
    Route("/api/channels", channels_json),
    Route("/channel", channel),
    Route("/api/channel", channel_json),
    Route("/actions/channel/limits", set_limits, methods=["POST"]),
    Route("/actions/channel/reset", reset_limits, methods=["POST"]),
    Route("/actions/channel-default/limits", set_default, methods=["POST"]),
    Route("/actions/channel-default/reset", reset_default, methods=["POST"]),
]

__all__ = ["describe", "limits_of", "routes"]
