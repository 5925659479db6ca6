"""The dashboard's queue page lists its live messages by what they wait on (a delay, a
defer, a signal, a cancellation, a delivery), and a message's page draws its deliveries on
a timeline (when each was taken and ended, how, how long it took), on every engine."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from sqlmq import Broker, Outcome, Settlement
from sqlmq.dashboard import create_app
from sqlmq.records import Delivery

from .conftest import on_every_engine

pytestmark = on_every_engine

BASE = "http://127.0.0.1"


@pytest.fixture
async def client(broker: Broker) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(broker)),
                                 base_url=BASE) as c:
        yield c


async def _taken(broker: Broker, queue: str = "jobs") -> Delivery:
    """A message published and taken at once (nothing else of ``queue`` is due)."""
    msg_id = await broker.publish(queue, {"job": 1})
    (d,) = await broker.engine.acquire([queue], 10, 30)
    assert d.id == msg_id
    return d


def _entry(d: Delivery, ended: str, **more: str) -> list[dict[str, object]]:
    return [*d.history, {"delivery": d.deliveries, "ended": ended, **more}]


def _listed(page: str) -> dict[int, str]:
    """The live list's rows: id -> what it waits on."""
    return {int(i): w for i, w in re.findall(r'<tr data-id="(\d+)" data-waits="(\w+)">', page)}


async def test_the_queue_page_lists_live_messages_by_what_they_wait_on(
        broker: Broker, client: httpx.AsyncClient) -> None:
    deferred = await _taken(broker)
    await broker.engine.settle([Settlement(deferred.id, 1, Outcome.DEFER, delay=3600,
                                           attempted=False,
                                           history=_entry(deferred, "deferred"))])
    running = await _taken(broker)
    cancelling = await _taken(broker)
    assert (await broker.cancel(cancelling.id)).outcome == "requested"
    delayed = await broker.publish("jobs", {"later": True}, delay=3600)
    ready = await broker.publish_batch("jobs", [{"now": 1}, {"now": 2}])

    page = (await client.get("/queue", params={"name": "jobs"})).text
    counts = dict(re.findall(r'data-waits="(\w+)">[^<]*<b>([\d,]+)</b>', page))
    assert counts == {"all": "6", "ready": "2", "running": "1", "delayed": "1",
                      "deferred": "1", "signal": "0", "steps": "0", "cancelling": "1"}
    assert _listed(page) == {deferred.id: "deferred", running.id: "running",
                             cancelling.id: "cancelling", delayed: "delayed",
                             ready[0]: "ready", ready[1]: "ready"}
    due = re.findall(r">in (59m \d\ds|1h 00m)</time>", page)
    assert len(due) == 2  # the delayed and the deferred, due in an hour

    only = (await client.get("/queue", params={"name": "jobs", "waits": "delayed"})).text
    assert _listed(only) == {delayed: "delayed"}
    assert 'class="chip w-delayed on"' in only
    two = await client.get("/queue?name=jobs&waits=deferred,cancelling")
    assert _listed(two.text) == {deferred.id: "deferred", cancelling.id: "cancelling"}
    later = await client.get("/queue", params={"name": "jobs", "after": running.id})
    assert sorted(_listed(later.text)) == [cancelling.id, delayed, *ready]

    api = (await client.get("/api/queue/messages",
                            params={"name": "jobs", "waits": "running"})).json()
    assert [(i["id"], i["waits"], i["state"]) for i in api["items"]] == [
        (running.id, "running", "PROCESSING")]
    assert api["next"] is None
    shown = (await client.get(f"/messages/{deferred.id}")).text
    assert "<dt>waits on</dt><dd>deferred</dd>" in shown

    for params, said in (({"waits": "bogus"}, "waits: a live message waits on none of "
                                              "'bogus'"),
                         ({"after": "abc"}, "'abc' is not a message id")):
        bad = await client.get("/queue", params={"name": "jobs", **params})
        assert bad.status_code == 400 and said in html.unescape(bad.text)
    bad_api = await client.get("/api/queue/messages", params={"name": "jobs", "waits": "x"})
    assert bad_api.status_code == 400 and "waits" in bad_api.json()["error"]


def _attempts(page: str) -> list[dict[str, str]]:
    """The timeline's rows: their delivery, ending and cells, as text."""
    rows = []
    for delivery, ended, body in re.findall(
            r'<tr class="attempt [^"]*" data-delivery="(\d+)" data-ended="(\w+)">(.*?)</tr>',
            page, re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip()
                 for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)]
        bar = re.search(r'<rect class="o-\w+" x="([\d.]+)%" y="2" width="([\d.]+)%"', body)
        assert bar is not None, body
        rows.append({"delivery": delivery, "ended": ended, "taken": cells[1],
                     "settled": cells[2], "took": cells[4], "x": float(bar.group(1)),
                     "width": float(bar.group(2)), "label": cells[0]})
    return rows


async def test_the_message_page_draws_each_delivery_on_a_timeline(
        broker: Broker, client: httpx.AsyncClient) -> None:
    first = await _taken(broker)
    await broker.engine.settle([Settlement(first.id, 1, Outcome.RETRY, delay=0.0,
                                           error="ValueError: boom",
                                           history=_entry(first, "error",
                                                          error="ValueError: boom"))])
    (second,) = await broker.engine.acquire(["jobs"], 10, 30)
    await broker.engine.settle([Settlement(second.id, 2, Outcome.COMPLETE)])
    page = (await client.get(f"/messages/{first.id}")).text
    one, two = _attempts(page)
    assert (one["delivery"], one["ended"], two["delivery"], two["ended"]) == (
        "1", "error", "2", "completed")
    assert one["taken"] != "–" and one["settled"] != "–" and one["took"] != "–"
    assert two["taken"] == "–" and two["took"] == "–"  # not recorded for a later one
    assert two["settled"] != "–"
    assert 0 <= one["x"] <= two["x"] <= 100 and one["x"] + one["width"] <= 100.01
    view = await broker.insights().message(first.id)
    assert view is not None and view.archived_at is not None
    assert f'<time datetime="{view.archived_at.isoformat()}"' in page
    # the history below it still shows every entry with its time
    (entry,) = view.history
    assert f"<td>{html.escape(entry['at'])}</td>" in page

    running = await _taken(broker, "other")
    live = (await client.get(f"/messages/{running.id}")).text
    (now,) = _attempts(live)
    assert (now["ended"], now["settled"]) == ("running", "running")
    assert f'<time datetime="{running.acquired_at.isoformat()}"' in live

    quick = await _taken(broker, "quick")  # done at its first delivery: no history entry
    await broker.engine.settle([Settlement(quick.id, 1, Outcome.COMPLETE)])
    (done,) = _attempts((await client.get(f"/messages/{quick.id}")).text)
    assert done["ended"] == "completed" and done["took"] not in ("", "–")


async def test_a_requeued_message_shows_its_deliveries_before_and_after(
        broker: Broker, client: httpx.AsyncClient) -> None:
    before = await _taken(broker)
    await broker.engine.settle([Settlement(before.id, 1, Outcome.FAIL, error="no",
                                           history=_entry(before, "failed", error="no"))])
    assert await broker.requeue(ids=[before.id]) == 1
    (after,) = await broker.engine.acquire(["jobs"], 10, 30)
    assert after.deliveries == 1
    await broker.engine.settle([Settlement(after.id, 1, Outcome.FAIL, error="again",
                                           history=_entry(after, "rejected", error="again"))])
    page = (await client.get(f"/messages/{before.id}")).text
    old, new = _attempts(page)
    assert (old["label"], new["label"]) == ("1", "1 (requeued)")
    assert (old["ended"], new["ended"]) == ("failed", "rejected")
    assert old["taken"] == "–" and new["taken"] != "–"  # the first since the requeue
    assert "again" in page and "Never delivered" not in page
