"""The web dashboard (``sqlmq dashboard``, :mod:`sqlmq.dashboard`) on every database, with
real rows: over HTTP in this process (the ASGI app on the test's broker), and end to end in
a real headless Chromium against the command serving on a free port.

What must hold: the pages show the figures ``broker.insights()`` has; every write changes
the database only when it is a confirmed POST carrying the anti-forgery field of an app that
is not read-only; a token, when set, is needed by every request; bad input and a database
that is down are pages with the right status, never a traceback.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sqlmq import Broker, Message, Outcome, Settlement
from sqlmq.dashboard import create_app

from .conftest import run_cli

CHROMIUM = "/usr/bin/chromium"
BASE = "http://127.0.0.1"


# ---- seeding and reading ---------------------------------------------------------------------


async def _settled(broker: Broker, queue: str, n: int, outcome: Outcome,
                   error: str | None = None) -> list[int]:
    """Publish ``n`` messages to ``queue`` and archive them with ``outcome``."""
    await broker.publish_batch(queue, [{"n": i} for i in range(n)])
    taken = await broker.engine.acquire([queue], n, 30)
    assert len(taken) == n
    await broker.engine.settle([Settlement(d.id, d.deliveries, outcome, error=error)
                                for d in taken])
    return sorted(d.id for d in taken)


async def _dead(broker: Broker, queue: str, n: int, error: str = "boom") -> list[int]:
    return await _settled(broker, queue, n, Outcome.FAIL, error)


async def _seed(broker: Broker) -> dict[str, Any]:
    """orders: 3 pending, 2 failed, 1 completed; emails: 1 pending, paused."""
    dead = await _dead(broker, "orders", 2, error="TimeoutError: gateway")
    done = await _settled(broker, "orders", 1, Outcome.COMPLETE)
    live = await broker.publish_batch("orders", [{"id": 7}, {"id": 8}, {"id": 9}])
    await broker.publish("emails", {"to": "a@example.com"})
    await broker.pause("emails")
    return {"dead": dead, "done": done, "live": live}


def _row(page: str, queue: str) -> dict[str, str]:
    """The overview's cells of ``queue``'s row, by column, as text."""
    found = re.search(rf'<tr data-queue="{re.escape(html.escape(queue))}">(.*?)</tr>', page,
                      re.S)
    assert found, f"no row for {queue!r} in the page"
    cells = {k: re.sub(r"<[^>]+>", "", v).strip() for k, v in
             re.findall(r'data-col="(\w+)"[^>]*>(.*?)</td>', found.group(1), re.S)}
    cells["name"] = found.group(1)
    return cells


def _without_age(row: dict[str, str]) -> dict[str, str]:
    """``row`` (:func:`_row`) without its oldest ready message's age, in its cell or in the
    row's markup."""
    return {k: re.sub(r'(data-col="oldest_ready_age"[^>]*>)[^<]*', r"\1", v)
            for k, v in row.items() if k != "oldest_ready_age"}


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no write form"
    return found.group(1)


@pytest.fixture
async def client(broker: Broker) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(create_app(broker)) as c:
        yield c


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)


async def _post(client: httpx.AsyncClient, path: str, csrf: str, confirmed: bool = True,
                **fields: Any) -> httpx.Response:
    data = {"csrf": csrf, **{k: str(v) for k, v in fields.items()}}
    if confirmed:
        data["confirmed"] = "1"
    return await client.post(path, data=data)


# ---- reading -----------------------------------------------------------------------------------


async def test_overview_shows_each_queue_with_its_counts(broker: Broker,
                                                         client: httpx.AsyncClient) -> None:
    await _seed(broker)
    read_at = time.monotonic()
    page = await client.get("/")
    assert page.status_code == 200
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    orders = _row(page.text, "orders")
    assert (orders["pending"], orders["processing"], orders["failed"], orders["completed"],
            orders["cancelled"]) == ("3", "0", "2", "1", "0")
    assert orders["failed_1h"] == "2" and "paused" not in orders["name"]
    emails = _row(page.text, "emails")
    assert emails["pending"] == "1" and "paused" in emails["name"]
    assert "https://" not in page.text  # nothing is loaded from elsewhere (no CDN)
    fragment = await client.get("/partials/overview")  # what the page refreshes itself with
    between = time.monotonic() - read_at
    assert fragment.status_code == 200
    refreshed = _row(fragment.text, "orders")
    # The oldest ready message's age (whole seconds) grows between the two reads: once a
    # second boundary fell between them (1s against 0s). The rest is the same row.
    ages = [re.fullmatch(r"(\d+)s", r["oldest_ready_age"]) for r in (refreshed, orders)]
    assert ages[0] and ages[1], ages
    assert 0 <= int(ages[0].group(1)) - int(ages[1].group(1)) <= between + 1, ages
    assert _without_age(refreshed) == _without_age(orders)
    assert "<html" not in fragment.text

    listed = {q["queue"]: q for q in (await client.get("/api/queues")).json()}
    assert (listed["orders"]["pending"], listed["orders"]["failed"],
            listed["orders"]["dead"]) == (3, 2, 2)
    assert listed["emails"]["paused"] is True and listed["orders"]["paused"] is False
    assert listed["orders"]["activity"]["1h"]["completed"] == 1


async def test_queue_page_charts_and_unknown_queue(broker: Broker,
                                                   client: httpx.AsyncClient) -> None:
    await _seed(broker)
    await _settled(broker, "orders", 4, Outcome.COMPLETE)
    await broker.publish("orders", {"c": 1}, channel="tenant-1")
    await broker.set_channel("tenant-1", max_concurrency=2)
    nightly = broker.periodic("nightly", cron="0 3 * * *", queue="orders", body={"x": 1})
    await broker.engine.register_schedule(nightly)
    page = await client.get("/queue", params={"name": "orders"})
    assert page.status_code == 200
    assert re.search(r'data-col="failed"><a [^>]*>2</a>', page.text)
    assert 'data-charts="/api/queue/charts?name=orders"' in page.text
    assert "Requeue 2 dead letters" in page.text and 'action="/actions/pause"' in page.text
    assert re.search(r'<td class="name">tenant-1</td><td>1</td><td>0</td>\s*<td>2</td>',
                     page.text)  # waiting, running, max concurrency
    assert re.search(r"<td class=\"name\">nightly</td><td>cron &#39;0 3 \* \* \*&#39;</td>"
                     r"<td>latest</td>", page.text)
    assert re.search(r'<time datetime="[^"]+T03:00:00\+00:00"', page.text)  # the next tick

    detail = (await client.get("/api/queue", params={"name": "orders"})).json()
    assert (detail["pending"], detail["completed"], detail["deliveries"]) == (4, 5, {"0": 4})
    assert [(c["name"], c["max_concurrency"], c["waiting"]) for c in detail["channels"]] == [
        ("tenant-1", 2, 1)]
    assert [s["name"] for s in detail["schedules"]] == ["nightly"]
    assert detail["schedules"][0]["next_tick_at"].endswith("T03:00:00+00:00")
    charts = (await client.get("/api/queue/charts", params={"name": "orders"})).json()
    assert len(charts["throughput"]["t"]) == 30  # two-minute buckets over the hour
    per_bucket = charts["throughput"]["completed"]  # per minute: 2 min buckets count double
    assert sum(per_bucket) * 2 == pytest.approx(detail["activity"]["1h"]["completed"])
    assert per_bucket[-1] * 2 == pytest.approx(5)  # all just now: in the newest bucket
    curve = charts["latency"]["seconds"]
    assert charts["latency"]["percentile"][0] == 0 and charts["latency"]["percentile"][-1] == 100
    assert curve == sorted(curve) and curve[-1] == pytest.approx(detail["latency"]["max"])

    paused_only = await client.get("/queue", params={"name": "never-used"})
    assert paused_only.status_code == 404
    assert "no queue named &#39;never-used&#39;" in paused_only.text
    assert "&#39;orders&#39;" in paused_only.text  # the queues that do exist are named
    assert (await client.get("/queue")).status_code == 400
    assert (await client.get("/api/queue", params={"name": "x"})).json()["status"] == 404
    await broker.pause("never-used")  # a paused queue without messages still has a page
    assert (await client.get("/queue", params={"name": "never-used"})).status_code == 200


async def test_message_page_shows_payload_headers_error_and_history(
        broker: Broker, client: httpx.AsyncClient) -> None:
    (dead,) = await _dead(broker, "orders", 1, error="<script>alert(1)</script>\n  at line 2")
    text = await broker.publish("notes", "plain <b>text</b>")
    raw = await broker.publish("blobs", b"\x00\x01sqlmq\xff" * 3, headers={"kind": "bin"})
    page = await client.get(f"/messages/{dead}")
    assert page.status_code == 200
    assert "<script>alert(1)" not in page.text  # escaped, not run
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\n  at line 2" in page.text
    assert '{\n  &#34;n&#34;: 0\n}' in page.text  # pretty-printed JSON
    assert 'action="/actions/requeue"' in page.text and 'action="/actions/delete"' in page.text

    shown = (await client.get(f"/messages/{text}")).text
    assert "plain &lt;b&gt;text&lt;/b&gt;" in shown and "payload-text" in shown
    assert 'action="/actions/cancel"' in shown and 'action="/actions/delete"' not in shown
    binary = (await client.get(f"/messages/{raw}")).text
    assert "00000000  00 01 73 71 6c 6d 71 ff" in binary and "..sqlmq." in binary
    assert "<td class=\"name\">bin</td>" in binary  # the header
    download = await client.get(f"/messages/{raw}/payload")
    assert download.content == b"\x00\x01sqlmq\xff" * 3
    assert (await client.get(f"/api/messages/{dead}")).json()["error"].startswith("<script>")

    missing = await client.get("/messages/987654321")
    assert missing.status_code == 404 and "no message 987654321" in missing.text
    assert "Traceback" not in missing.text
    bad = await client.get("/messages/abc")
    assert bad.status_code == 400 and "&#39;abc&#39; is not a message id" in bad.text
    assert (await client.get("/api/messages/987654321")).json() == {
        "error": "no message 987654321: it is not waiting, running or archived (it may have "
                 "been purged)", "status": 404}


async def test_message_page_shows_the_result_its_subscriber_kept(
        broker: Broker, client: httpx.AsyncClient) -> None:
    @broker.subscriber("thumbs", results=True, flush_interval=0.01)
    async def thumb(body: str) -> Any:
        return {"url": "<b>cat</b>.png"} if body == "json" else b"\x00\xffpng"

    await broker.start()
    made = await broker.publish("thumbs", "json")
    raw = await broker.publish("thumbs", "bytes")
    plain = await broker.publish("notes", "no result")
    assert await broker.result(made, timeout=20) == {"url": "<b>cat</b>.png"}
    await broker.result(raw, timeout=20)
    page = (await client.get(f"/messages/{made}")).text
    assert "<h2>Result" in page and "json, 24 bytes" in page
    assert '&#34;url&#34;: &#34;&lt;b&gt;cat&lt;/b&gt;.png&#34;' in page  # escaped, pretty
    binary = (await client.get(f"/messages/{raw}")).text
    assert "<h2>Result" in binary and "00000000  00 ff 70 6e 67" in binary
    assert "<h2>Result" not in (await client.get(f"/messages/{plain}")).text
    api = (await client.get(f"/api/messages/{made}")).json()
    assert api["result"] == {"url": "<b>cat</b>.png"}
    assert (await client.get(f"/api/messages/{raw}")).json()["result_base64"] == "AP9wbmc="


def test_payloads_show_as_json_text_or_hex_and_large_ones_are_cut() -> None:
    from sqlmq.dashboard.views import PAYLOAD_SHOWN, payload

    assert payload(b'{"a":[1,2]}').shown == payload(b'{"a": [1, 2]}').shown
    assert payload(b'{"a":[1,2]}').shown == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert (payload('"quoted" text é'.encode()).kind, payload(b'"json string"').kind) == (
        "text", "json")
    small = payload(b"\x00\xffab")
    assert (small.kind, small.shown, small.cut) == ("binary", "00000000  00 ff 61 62"
                                                    + " " * 36 + "  ..ab", False)
    big = payload(b"\xff" * (PAYLOAD_SHOWN + 1))
    assert big.cut and big.shown.count("\n") == PAYLOAD_SHOWN // 16 - 1
    huge = payload(("é" * (2 * 1024 * 1024)).encode())  # past the pretty-printing limit
    assert (huge.kind, huge.cut, len(huge.shown)) == ("text", True, PAYLOAD_SHOWN // 2)
    long_json = payload(json.dumps(list(range(40_000))).encode())
    assert (long_json.kind, long_json.cut, len(long_json.shown)) == ("json", True,
                                                                     PAYLOAD_SHOWN)


async def test_archive_filters_and_keyset_pages(broker: Broker,
                                                client: httpx.AsyncClient) -> None:
    timeouts = await _dead(broker, "orders", 5, error="TimeoutError: gateway")
    refused = await _dead(broker, "orders", 3, error="ConnectionRefused")
    await _settled(broker, "orders", 2, Outcome.COMPLETE)
    other = await _dead(broker, "emails", 2, error="TimeoutError: smtp")

    def ids(page: str) -> list[int]:
        return [int(i) for i in re.findall(r'<tr data-id="(\d+)">', page)]

    found = await client.get("/archive", params={"queue": "orders", "state": "FAILED",
                                                 "error": "Timeout"})
    assert found.status_code == 200 and sorted(ids(found.text)) == timeouts
    assert sorted(ids((await client.get("/archive", params={"error": "Timeout"})).text)) == \
        sorted(timeouts + other)
    dead_letters = await client.get("/archive?state=FAILED&state=CANCELLED")
    assert "<title>Dead letters" in dead_letters.text and len(ids(dead_letters.text)) == 10

    seen: list[int] = []  # three rows a page: every dead letter of orders once, newest first
    url: str | None = "/archive?queue=orders&state=failed&limit=3"
    while url is not None:
        page = await client.get(url)
        assert page.status_code == 200
        seen += ids(page.text)
        nxt = re.search(r'rel="next" href="([^"]+)"', page.text)
        url = html.unescape(nxt.group(1)) if nxt else None
    assert seen == sorted(timeouts + refused, reverse=True)

    as_json = (await client.get("/api/archive", params={"state": "FAILED", "limit": 4})).json()
    assert len(as_json["items"]) == 4 and as_json["next"]["after_id"] == str(
        as_json["items"][-1]["id"])
    assert ids((await client.get("/archive", params={"to": "2000-01-01T00:00"})).text) == []
    assert len(ids((await client.get("/archive", params={
        "from": "2000-01-01T00:00", "to": "2999-01-01T00:00:00+02:00"})).text)) == 12

    for params, reason in (({"state": "WEIRD"}, "state: no archived state &#39;WEIRD&#39;"),
                           ({"limit": "0"}, "limit: a page shows 1 to 500"),
                           ({"limit": "many"}, "limit: &#39;many&#39; is not a whole number"),
                           ({"from": "yesterday"}, "from: &#39;yesterday&#39; is not a date"),
                           ({"from": "2024-02-01", "to": "2024-01-01"}, "from: must be before"),
                           ({"after_at": "2024-01-01T00:00"}, "after_at and after_id go"),
                           ({"after_at": "2024-01-01", "after_id": "x"}, "is not a message id")):
        bad = await client.get("/archive", params=params)
        assert bad.status_code == 400, params
        assert reason in bad.text, (params, bad.text)
    assert (await client.get("/api/archive", params={"state": "X"})).status_code == 400


async def test_workers_and_paused_pages(broker: Broker, client: httpx.AsyncClient) -> None:
    empty = await client.get("/workers")
    assert empty.status_code == 200 and "No live worker" in empty.text

    @broker.subscriber("orders", max_fetch_interval=0.05)
    async def handle(msg: Message) -> None:
        pass

    await broker.start()
    try:
        page = await client.get("/workers")
        assert f"<td>{os.getpid()}</td>" in page.text and "handle" in page.text
        (me,) = (await client.get("/api/workers")).json()
        assert (me["id"], me["pid"]) == (broker.worker_id, os.getpid())
        assert me["heartbeat_age"] >= 0 and me["subscribers"][0]["queues"] == ["orders"]
        assert (await client.get("/partials/workers")).status_code == 200
    finally:
        await broker.stop()
    await broker.pause("reports")
    paused = await client.get("/paused")
    assert '<tr data-queue="reports">' in paused.text and 'action="/actions/resume"' in paused.text
    assert [p["queue"] for p in (await client.get("/api/paused")).json()] == ["reports"]


# ---- writing -----------------------------------------------------------------------------------


async def test_writes_change_the_database_once_confirmed(broker: Broker,
                                                         client: httpx.AsyncClient) -> None:
    seeded = await _seed(broker)
    insights = broker.insights()
    page = await client.get("/queue", params={"name": "orders"})
    csrf = _csrf(page.text)
    one, other = seeded["dead"]

    asked = await _post(client, "/actions/requeue", csrf, confirmed=False, id=one)
    assert asked.status_code == 200 and "Requeue message" in asked.text
    assert 'name="confirmed" value="1"' in asked.text  # the page that asks again
    assert not (await insights.message(one)).live  # nothing done yet

    done = await _post(client, "/actions/requeue", csrf, id=one, next="/archive")
    assert (done.status_code, done.headers["location"]) == (303, "/archive")
    view = await insights.message(one)
    assert view.live and view.state == "PENDING"
    shown = await client.get("/archive")  # the notice, once
    assert f"Requeued message {one} to queue &#39;orders&#39;." in shown.text
    assert "Requeued message" not in (await client.get("/archive")).text
    again = await _post(client, "/actions/requeue", csrf, id=one)
    assert again.status_code == 409 and "not archived" in again.text

    assert (await _post(client, "/actions/requeue", csrf, id=seeded["done"][0])).status_code \
        == 409  # a COMPLETED message is not a dead letter
    await _dead(broker, "orders", 2)
    bulk = await _post(client, "/actions/requeue", csrf, queue="orders")
    assert bulk.status_code == 303
    (q,) = [q for q in await insights.queues() if q.queue == "orders"]
    assert (q.stats.failed, q.stats.pending) == (0, 3 + 1 + 3)  # 3 seeded, 1, then 1 + 2

    (done_id,) = seeded["done"]
    live = seeded["live"][0]
    refused = await _post(client, "/actions/delete", csrf, id=live)
    assert refused.status_code == 409 and "cancel it instead" in refused.text
    deleted = await _post(client, "/actions/delete", csrf, id=done_id,
                          next=f"/messages/{done_id}")
    assert deleted.status_code == 303 and deleted.headers["location"] == "/archive?queue=orders"
    assert await insights.message(done_id) is None
    assert (await _post(client, "/actions/delete", csrf, id=done_id)).status_code == 404
    assert other != one

    await _settled(broker, "orders", 2, Outcome.COMPLETE)
    kept = await _post(client, "/actions/purge", csrf, queue="orders", older_than="1h")
    assert kept.status_code == 303
    (q,) = [q for q in await insights.queues() if q.queue == "orders"]
    assert q.stats.completed == 2  # none older than an hour
    bad = await _post(client, "/actions/purge", csrf, queue="orders", older_than="soon")
    assert bad.status_code == 400 and "older_than: &#39;soon&#39; is not a duration" in bad.text
    await asyncio.sleep(1.1)  # older than the cut, on the database clock
    purged = await _post(client, "/actions/purge", csrf, queue="orders", older_than="1s",
                         state="completed")
    assert purged.status_code == 303
    (q,) = [q for q in await insights.queues() if q.queue == "orders"]
    assert q.stats.completed == 0 and q.stats.pending == 7

    assert (await _post(client, "/actions/pause", csrf, queue="orders")).status_code == 303
    assert sorted(p.queue for p in await broker.paused()) == ["emails", "orders"]
    assert (await _post(client, "/actions/resume", csrf, queue="emails")).status_code == 303
    assert [p.queue for p in await broker.paused()] == ["orders"]
    bad_name = await _post(client, "/actions/pause", csrf, queue="q" * 1000)
    assert bad_name.status_code == 400 and "queue name" in bad_name.text

    cancelled = await _post(client, "/actions/cancel", csrf, id=live)
    assert cancelled.status_code == 303
    assert (await insights.message(live)).state == "CANCELLED"


async def test_forged_and_foreign_writes_are_refused(broker: Broker,
                                                     client: httpx.AsyncClient) -> None:
    (dead,) = await _dead(broker, "orders", 1)
    for fields in ({}, {"csrf": "forged"}):
        refused = await client.post("/actions/requeue", data={"id": dead, "confirmed": "1",
                                                              **fields})
        assert refused.status_code == 403
    assert "reload the page" in refused.text
    not_a_form = await client.post("/actions/requeue", json={"id": dead})
    assert not_a_form.status_code == 415
    csrf = _csrf((await client.get(f"/messages/{dead}")).text)
    away = await _post(client, "/actions/requeue", csrf, id=dead, next="https://evil.example/")
    assert away.headers["location"] == f"/messages/{dead}"  # never off the dashboard
    assert (await client.post("/queue?name=orders")).status_code == 405
    assert (await client.get("/actions/requeue")).status_code == 405


async def test_read_only_offers_no_write_and_refuses_every_post(broker: Broker) -> None:
    seeded = await _seed(broker)
    dead = seeded["dead"][0]
    app = create_app(broker, read_only=True)
    async with _client(app) as client:
        writable = create_app(broker).state.dashboard.csrf
        pages = ["/", "/queue?name=orders", f"/messages/{dead}", "/archive?state=FAILED",
                 "/paused", "/workers"]
        for path in pages:
            page = await client.get(path)
            assert page.status_code == 200, path
            assert 'method="post"' not in page.text and "Requeue" not in page.text, path
            assert "read-only" in page.text
        csrf = app.state.dashboard.csrf  # a forged form could not know it; still refused
        assert csrf != writable
        for path, fields in (("/actions/requeue", {"id": dead}), ("/actions/pause",
                                                                  {"queue": "orders"}),
                             ("/actions/purge", {"queue": "orders", "older_than": "0s"}),
                             ("/actions/delete", {"id": dead})):
            refused = await _post(client, path, csrf, **fields)
            assert refused.status_code == 403 and "read-only" in refused.text
    assert not (await broker.insights().message(dead)).live
    assert [p.queue for p in await broker.paused()] == ["emails"]


async def test_a_token_is_needed_by_every_request(broker: Broker) -> None:
    await _seed(broker)
    async with _client(create_app(broker, token="s3cret-token")) as client:
        for path in ("/", "/static/dashboard.css", "/messages/1", "/nothing"):
            refused = await client.get(path)
            assert refused.status_code == 401, path
            assert "needs its token" in refused.text
        api = await client.get("/api/queues")
        assert api.status_code == 401 and "needs its token" in api.json()["error"]
        assert (await client.get("/?token=wrong")).status_code == 401
        assert (await client.get("/", headers={"Authorization": "Bearer nope"})).status_code == 401
        bearer = await client.get("/api/queues", headers={"Authorization": "Bearer s3cret-token"})
        assert bearer.status_code == 200 and {q["queue"] for q in bearer.json()} == {"orders",
                                                                                    "emails"}
        first = await client.get("/archive?state=FAILED&token=s3cret-token")
        assert (first.status_code, first.headers["location"]) == (303, "/archive?state=FAILED")
        cookie = first.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert "s3cret-token" not in cookie  # a digest, not the token
        page = await client.get("/archive?state=FAILED")  # the cookie now
        assert page.status_code == 200 and "s3cret-token" not in page.text
        assert (await client.get("/static/dashboard.css")).status_code == 200


def test_the_command_refuses_a_public_address_without_a_token(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SQLMQ_DASHBOARD_TOKEN", raising=False)
    url = ["--url", "sqlite:///nowhere-dashboard.db"]
    for host in ("0.0.0.0", "192.0.2.1", "example.com", "::"):
        refused = run_cli("dashboard", *url, "--host", host)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith(f"sqlmq: error: refusing to serve on {host} without "
                                         "a token")
        assert len(refused.stderr.splitlines()) == 1
    empty = run_cli("dashboard", *url, "--token", " ")
    assert empty.returncode == 2 and "the token is empty" in empty.stderr
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # the extra is not installed
    missing = run_cli("dashboard", *url)
    assert missing.returncode == 2
    assert missing.stderr.strip() == ("sqlmq: error: sqlmq dashboard needs uvicorn: pip install "
                                      "'sqlmq[dashboard]'")


async def test_errors_are_pages_with_their_status(tmp_path: Path) -> None:
    down = Broker("postgresql://ops:hunter2@127.0.0.1:1/none")  # nothing listens on port 1
    try:
        async with _client(create_app(down)) as client:
            page = await client.get("/")
            assert page.status_code == 503
            assert "the database did not answer" in page.text and "Traceback" not in page.text
            assert "hunter2" not in page.text and "postgresql://ops:***@127.0.0.1:1" in page.text
            assert (await client.get("/api/queues")).json()["status"] == 503
            fragment = await client.get("/partials/overview")
            assert fragment.status_code == 503 and fragment.text.startswith("the database")
    finally:
        await down.close()
    bare = Broker(f"sqlite:///{tmp_path}/bare.db")  # never migrated
    try:
        async with _client(create_app(bare)) as client:
            page = await client.get("/archive")
            assert page.status_code == 503 and "run `sqlmq migrate" in page.text
            assert (await client.get("/nothing")).status_code == 404
    finally:
        await bare.close()


async def test_a_loopback_dashboard_answers_only_loopback_host_names(tmp_path: Path) -> None:
    """What ``sqlmq dashboard`` sets without a token: a page that rebinds its own name to
    127.0.0.1 (DNS rebinding) still sends its own Host, and is refused."""
    broker = Broker(f"sqlite:///{tmp_path}/hosts.db")
    await broker.migrate()
    try:
        app = create_app(broker, allowed_hosts=["127.0.0.1", "localhost", "::1", "[::1]"])
        async with _client(app) as client:
            assert (await client.get("/")).status_code == 200
            assert (await client.get("/", headers={"Host": "localhost:8080"})).status_code == 200
            assert (await client.get("/", headers={"Host": "[::1]:8080"})).status_code == 200
            rebound = await client.get("/", headers={"Host": "attacker.example:8080"})
            assert rebound.status_code == 400
    finally:
        await broker.close()


async def test_the_app_mounts_under_a_prefix(broker: Broker) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    await _seed(broker)
    outer = Starlette(routes=[Mount("/ops/mq", app=create_app(broker))])
    async with _client(outer) as client:
        page = await client.get("/ops/mq/")
        assert page.status_code == 200 and 'href="/ops/mq/static/dashboard.css"' in page.text
        assert 'href="/ops/mq/queue?name=orders"' in page.text
        assert (await client.get("/ops/mq/static/dashboard.js")).status_code == 200
        csrf = _csrf((await client.get("/ops/mq/queue?name=orders")).text)
        done = await _post(client, "/ops/mq/actions/pause", csrf, queue="orders")
        assert done.headers["location"] == "/ops/mq/queue?name=orders"


# ---- in a real browser ---------------------------------------------------------------------------

browser = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"SKIPPED THE REAL-BROWSER TESTS: no Chromium at {CHROMIUM} (apt-get install "
           "chromium; ./dev test installs it)")


async def _serve(*args: str) -> tuple[asyncio.subprocess.Process, int]:
    """``sqlmq dashboard ARGS --port 0`` in a process of its own; its port."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sqlmq.cli", "dashboard", *args, "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    except TimeoutError:
        proc.kill()
        raise
    found = re.search(r"sqlmq dashboard on http://[^ ]+:(\d+)/", line)
    if found is None:
        proc.kill()
        _, err = await proc.communicate()
        pytest.fail(f"sqlmq dashboard did not start: {line!r} {err.decode()[-2000:]}")
    return proc, int(found.group(1))


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM: the dashboard stops serving, closes its broker and exits 0, quietly."""
    if proc.returncode is None:
        proc.terminate()
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail("sqlmq dashboard did not stop within 30 s of SIGTERM")
    assert proc.returncode == 0, err.decode()[-3000:]
    assert b"Traceback" not in err, err.decode()[-3000:]


@browser
async def test_in_a_real_browser_the_dashboard_shows_and_requeues(broker: Broker, db_url: str,
                                                                  prefix: str) -> None:
    from playwright.async_api import async_playwright, expect

    seeded = await _seed(broker)
    dead = seeded["dead"][0]
    proc, port = await _serve("--url", db_url, "--prefix", prefix, "--refresh", "1")
    base = f"http://127.0.0.1:{port}"
    problems: list[str] = []
    try:
        async with async_playwright() as p:
            chromium = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = await chromium.new_page()
                page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                page.on("console", lambda m: problems.append(
                    f"console: {m.text} {m.location}") if m.type == "error" else None)
                page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))

                await page.goto(f"{base}/")
                row = page.locator('tr[data-queue="orders"]')
                assert await row.locator('[data-col="pending"]').inner_text() == "3"
                assert await row.locator('[data-col="failed"]').inner_text() == "2"
                assert await page.locator('tr[data-queue="emails"] .badge.paused').count() == 1
                await broker.publish("orders", {"id": 10})  # the page refreshes itself
                await expect(row.locator('[data-col="pending"]')).to_have_text("4",
                                                                              timeout=20_000)

                await page.goto(f"{base}/queue?name=orders")  # the charts draw
                await page.wait_for_selector('[data-chart="throughput"] canvas', timeout=20_000)
                await page.wait_for_selector('[data-chart="backlog"] canvas', timeout=20_000)

                await page.goto(f"{base}/archive?queue=orders&state=FAILED")
                await page.locator(f'tr[data-id="{dead}"] button', has_text="Requeue").click()
                await page.wait_for_selector(".notice", timeout=20_000)
                assert f"Requeued message {dead}" in await page.locator(".notice").inner_text()
                view = await broker.insights().message(dead)
                assert view is not None and view.live and view.state == "PENDING"
                (q,) = [q for q in await broker.insights().queues() if q.queue == "orders"]
                assert (q.stats.pending, q.stats.failed) == (5, 1)

                await page.goto(f"{base}/messages/{dead}")
                assert "PENDING" in await page.locator("h1 + .state").inner_text()
            finally:
                await chromium.close()
    finally:
        await _stop(proc)
    assert problems == []


@browser
async def test_in_a_real_browser_a_public_dashboard_needs_its_token(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    url = f"sqlite:///{tmp_path}/token.db"
    seeding = Broker(url)
    await seeding.migrate()
    await _dead(seeding, "orders", 1)
    await seeding.close()
    proc, port = await _serve("--url", url, "--host", "0.0.0.0", "--token", "tok-123456789")
    base = f"http://127.0.0.1:{port}"
    try:
        async with async_playwright() as p:
            chromium = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = await chromium.new_page()
                refused = await page.goto(f"{base}/")
                assert refused is not None and refused.status == 401
                assert "needs its token" in await page.content()
                opened = await page.goto(f"{base}/?token=tok-123456789")
                assert opened is not None and opened.status == 200
                assert page.url == f"{base}/"  # the token is not left in the address
                assert await page.locator('tr[data-queue="orders"] [data-col="failed"]'
                                          ).inner_text() == "1"
                later = await page.goto(f"{base}/workers")  # the cookie carries it on
                assert later is not None and later.status == 200
                elsewhere = await chromium.new_page()  # a browser that was not given it
                denied = await elsewhere.goto(f"{base}/workers")
                assert denied is not None and denied.status == 401
            finally:
                await chromium.close()
        async with httpx.AsyncClient() as plain:  # a script: the header
            api = await plain.get(f"{base}/api/queues",
                                  headers={"Authorization": "Bearer tok-123456789"})
            assert api.status_code == 200 and json.loads(api.text)[0]["failed"] == 1
            assert (await plain.get(f"{base}/api/queues")).status_code == 401
    finally:
        await _stop(proc)
