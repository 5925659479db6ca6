"""Bulk repairs from the dashboard's archive browser, on every engine and in a real browser:
the rows ticked on a page, or every archived message the filter matches, requeued or
deleted once confirmed with their count; a filter's repair runs as a job of the server in
batches, whose page shows its progress and exact count; bad input and read-only are
refused and change nothing."""

from __future__ import annotations

import asyncio
import html
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sqlmq import Broker, Outcome, Settlement
from sqlmq.dashboard import create_app
from sqlmq.dashboard.bulk import BATCH
from sqlmq.views import ArchiveQuery

from .conftest import drop_tables, on_every_engine, url_for
from .test_dashboard import CHROMIUM, _serve, _stop, browser

BASE = "http://127.0.0.1"


async def _archived(broker: Broker, queue: str, n: int, outcome: Outcome = Outcome.FAIL,
                    error: str | None = "TimeoutError: gateway") -> list[int]:
    """``n`` messages of ``queue`` archived with ``outcome`` and ``error``."""
    await broker.publish_batch(queue, [{"n": i} for i in range(n)])
    taken = await broker.engine.acquire([queue], n, 30)
    assert len(taken) == n
    ended = {Outcome.FAIL: "failed", Outcome.CANCEL: "cancelled"}.get(outcome)
    await broker.engine.settle([Settlement(
        d.id, d.deliveries, outcome, error=error,
        history=None if ended is None else [{"delivery": d.deliveries, "ended": ended}])
        for d in taken])
    return sorted(d.id for d in taken)


async def _counts(broker: Broker, queue: str) -> tuple[int, int, int, int]:
    """pending, failed, cancelled, completed of ``queue``."""
    for s in await broker.stats():
        if s.queue == queue:
            return s.pending, s.failed, s.cancelled, s.completed
    return 0, 0, 0, 0


@pytest.fixture
async def client(broker: Broker) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(broker)),
                                 base_url=BASE) as c:
        yield c


async def _csrf(client: httpx.AsyncClient) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/archive")).text)
    assert found, "the archive page has no write form"
    return found.group(1)


async def _post(client: httpx.AsyncClient, csrf: str, fields: list[tuple[str, Any]],
                confirmed: bool = True) -> httpx.Response:
    data = [("csrf", csrf), *((k, str(v)) for k, v in fields)]
    if confirmed:
        data.append(("confirmed", "1"))
    return await client.post("/actions/bulk", content=str(httpx.QueryParams(data)),
                             headers={"content-type": "application/x-www-form-urlencoded"})


def _question(page: str) -> str:
    found = re.search(r'<p class="question">(.*?)</p>', page, re.S)
    assert found, page[:2000]
    return html.unescape(found.group(1))


async def _finished(client: httpx.AsyncClient, location: str) -> list[dict[str, Any]]:
    """What ``/api`` + ``location`` said until the job ended, in order."""
    seen: list[dict[str, Any]] = []
    for _ in range(600):
        found = (await client.get(f"/api{location}")).json()
        seen.append(found)
        if found["state"] != "running":
            return seen
        await asyncio.sleep(0.02)
    pytest.fail(f"the job did not end: {seen[-1]}")


# ---- the rows ticked ------------------------------------------------------------------------


@on_every_engine
async def test_the_ticked_rows_are_requeued_or_deleted_once_confirmed(
        broker: Broker, client: httpx.AsyncClient) -> None:
    dead = await _archived(broker, "orders", 3)
    (done,) = await _archived(broker, "orders", 1, Outcome.COMPLETE, None)
    page = await client.get("/archive", params={"queue": "orders"})
    ticks = re.findall(r'<input type="checkbox" name="id" value="(\d+)" form="bulk"', page.text)
    assert sorted(map(int, ticks)) == sorted([*dead, done])  # one per row
    assert "select all 4 matching this filter" in page.text
    csrf = await _csrf(client)

    picked = [("repair", "requeue"), ("id", dead[0]), ("id", dead[2]), ("next", "/archive")]
    asked = await _post(client, csrf, picked, confirmed=False)
    assert asked.status_code == 200
    assert _question(asked.text) == (f"Requeue 2 selected dead letters ({dead[0]}, {dead[2]}) "
                                     "as fresh deliveries? They run again.")
    assert await _counts(broker, "orders") == (0, 3, 0, 1)  # nothing done yet
    requeued = await _post(client, csrf, picked)
    assert (requeued.status_code, requeued.headers["location"]) == (303, "/archive")
    assert "Requeued 2 dead letters of the 2 selected." in (await client.get("/archive")).text
    assert await _counts(broker, "orders") == (2, 1, 0, 1)

    gone = [("repair", "delete"), ("id", dead[1]), ("id", done)]
    assert "Delete 2 selected archived messages" in _question(
        (await _post(client, csrf, gone, confirmed=False)).text)
    assert (await _post(client, csrf, gone)).status_code == 303
    assert await _counts(broker, "orders") == (2, 0, 0, 0)
    assert await broker.insights().message(done) is None


@on_every_engine
async def test_bad_selections_and_filters_are_refused_and_change_nothing(
        broker: Broker, client: httpx.AsyncClient) -> None:
    (dead,) = await _archived(broker, "orders", 1)
    (done,) = await _archived(broker, "orders", 1, Outcome.COMPLETE, None)
    live = await broker.publish("orders", {"live": True})
    csrf = await _csrf(client)
    refusals = [
        ([("repair", "requeue")], 400, "no message selected"),
        ([("repair", "delete"), ("id", "")], 400, "no message selected"),
        ([("repair", "requeue"), ("id", 987654321)], 400, "no message 987654321"),
        ([("repair", "requeue"), ("id", dead), ("id", "abc")], 400,
         "'abc' is not a message id"),
        ([("repair", "requeue"), ("id", dead), ("id", live)], 409,
         f"message {live} is PENDING, not archived"),
        ([("repair", "requeue"), ("id", done)], 409, f"message {done} ended COMPLETED"),
        ([("repair", "purge"), ("id", dead)], 400, "'purge' is not a bulk repair"),
        ([("id", dead)], 400, "repair: missing"),
        ([("repair", "delete"), ("scope", "everything")], 400, "scope: 'everything'"),
        ([("repair", "requeue"), ("scope", "filter"), ("state", "BOGUS")], 400,
         "state: no archived state 'BOGUS'"),
        ([("repair", "delete"), ("scope", "filter"), ("from", "yesterday")], 400,
         "from: 'yesterday' is not a date and time"),
        ([("repair", "delete"), ("scope", "filter"), ("from", "2030-01-02T00:00"),
          ("to", "2030-01-01T00:00")], 400, "from: must be before to"),
        ([("repair", "delete"), ("scope", "filter"), ("upto", "soon")], 400,
         "upto: 'soon' is not a date and time"),
        ([("repair", "requeue"), ("scope", "filter"), ("state", "COMPLETED")], 400,
         "hold no dead letter"),
        ([("repair", "requeue"), ("scope", "filter"), ("queue", "elsewhere")], 409,
         "no dead letter of queue 'elsewhere' matching state FAILED or CANCELLED (anymore): "
         "nothing to requeue"),
    ]
    for fields, status, said in refusals:
        refused = await _post(client, csrf, fields)
        assert refused.status_code == status and said in html.unescape(refused.text), (
            fields, refused.status_code, refused.text[-1500:])
        assert "Traceback" not in refused.text
    assert await _counts(broker, "orders") == (1, 1, 0, 1)
    assert (await client.get("/operations/nope")).status_code == 404
    assert (await client.get("/api/operations/nope")).json()["status"] == 404


# ---- every match of a filter ------------------------------------------------------------------


@on_every_engine
async def test_a_filter_is_requeued_by_a_job_in_batches_with_its_exact_count(
        broker: Broker, client: httpx.AsyncClient) -> None:
    n = 2 * BATCH + 7
    await _archived(broker, "orders", n)
    await _archived(broker, "orders", 3, error="ValueError: not this one")
    await _archived(broker, "orders", 2, Outcome.CANCEL, "TimeoutError: cancelled")
    await _archived(broker, "other", 4)
    filters = [("queue", "orders"), ("state", "FAILED"), ("error", "TimeoutError")]
    page = await client.get("/archive", params=filters)
    assert f"select all {n:,} matching this filter" in page.text
    csrf = await _csrf(client)
    asked = await _post(client, csrf, [("repair", "requeue"), ("scope", "filter"), *filters],
                        confirmed=False)
    assert _question(asked.text) == (f"Requeue {n:,} dead letters of queue 'orders' matching "
                                     "state FAILED, error containing 'TimeoutError'? They "
                                     "all run again.")
    upto = re.search(r'name="upto" value="([^"]+)"', asked.text)
    assert upto is not None  # what it counted is what it moves
    assert await _counts(broker, "orders") == (0, n + 3, 2, 0)

    started = await _post(client, csrf, [("repair", "requeue"), ("scope", "filter"),
                                         ("upto", html.unescape(upto.group(1))), *filters,
                                         ("next", "/archive?queue=orders")])
    assert started.status_code == 303
    location = started.headers["location"]
    assert re.fullmatch(r"/operations/[0-9a-f]{12}", location)
    shown = await client.get(location)
    assert shown.status_code == 200 and "<progress" in shown.text
    seen = await _finished(client, location)
    done = [s["done"] for s in seen]
    assert done == sorted(done) and all(s["total"] == n for s in seen)
    last = seen[-1]
    assert (last["state"], last["done"], last["error"]) == ("done", n, None)
    assert last["result"] == (f"Requeued {n:,} dead letters of queue 'orders' matching state "
                              "FAILED, error containing 'TimeoutError'.")
    assert last["back"] == "/archive?queue=orders"
    assert await _counts(broker, "orders") == (n, 3, 2, 0)
    assert await _counts(broker, "other") == (0, 4, 0, 0)
    ended = (await client.get(location)).text
    assert last["result"] in html.unescape(ended) and "data-result>" in ended


@on_every_engine
async def test_a_filter_is_deleted_by_a_job_and_a_new_match_is_left_alone(
        broker: Broker, client: httpx.AsyncClient) -> None:
    await _archived(broker, "orders", 30, Outcome.COMPLETE, None)
    await _archived(broker, "orders", 5, Outcome.FAIL, "rate 50% reached")
    csrf = await _csrf(client)
    fields = [("repair", "delete"), ("scope", "filter"), ("queue", "orders")]
    asked = await _post(client, csrf, fields, confirmed=False)
    assert _question(asked.text) == ("Delete 35 archived messages of queue 'orders'? This "
                                     "cannot be undone.")
    upto = re.search(r'name="upto" value="([^"]+)"', asked.text)
    assert upto is not None
    await asyncio.sleep(0.05)
    await _archived(broker, "orders", 2, Outcome.COMPLETE, None)  # after the count
    started = await _post(client, csrf, [*fields, ("upto", html.unescape(upto.group(1)))])
    last = (await _finished(client, started.headers["location"]))[-1]
    assert (last["state"], last["done"], last["total"]) == ("done", 35, 35)
    assert last["result"] == "Deleted 35 archived messages of queue 'orders'."
    assert await _counts(broker, "orders") == (0, 0, 0, 2)


async def test_one_job_at_a_time_and_a_failed_one_says_so(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    await _archived(broker, "orders", 2)
    app = create_app(broker)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        await _jobs_one_at_a_time(broker, app.state.dashboard.jobs, c, caplog)


async def _jobs_one_at_a_time(broker: Broker, jobs: Any, client: httpx.AsyncClient,
                              caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()

    async def held(progress: Any) -> int:
        progress(1)
        await release.wait()
        return 1

    first = jobs.start("requeue", "Requeue 1 held", 1, "/archive", held, lambda n: "held")
    csrf = await _csrf(client)
    busy = await _post(client, csrf, [("repair", "requeue"), ("scope", "filter")])
    assert busy.status_code == 409 and "another bulk repair is running" in busy.text
    assert f"/operations/{first.id}" in busy.text
    release.set()
    assert (await _finished(client, f"/operations/{first.id}"))[-1]["result"] == "held"

    async def broken(progress: Any) -> int:
        progress(1)
        raise RuntimeError("the database went away")

    with caplog.at_level(logging.ERROR, logger="sqlmq.dashboard"):
        failed = jobs.start("delete", "Delete 2 broken", 2, "/archive", broken, str)
        last = (await _finished(client, f"/operations/{failed.id}"))[-1]
    assert last["state"] == "failed" and last["result"] is None
    assert last["error"] == ("failed after 1 of 2 (RuntimeError: the database went away); "
                             "those stay done, the batch in flight was rolled back")
    logged = [r for r in caplog.records if "Delete 2 broken failed" in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # with its traceback
    page = (await client.get(f"/operations/{failed.id}")).text
    assert "the database went away" in page and "data-error>" in page
    assert await _counts(broker, "orders") == (0, 2, 0, 0)


@on_every_engine
async def test_read_only_offers_no_bulk_repair_and_refuses_it(broker: Broker) -> None:
    (dead,) = await _archived(broker, "orders", 1)
    app = create_app(broker, read_only=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        page = await c.get("/archive", params={"state": "FAILED"})
        assert page.status_code == 200
        assert 'name="id"' not in page.text and "/actions/bulk" not in page.text
        csrf = app.state.dashboard.csrf
        for fields in ([("repair", "requeue"), ("id", dead)],
                       [("repair", "delete"), ("id", dead)],
                       [("repair", "requeue"), ("scope", "filter"), ("queue", "orders")],
                       [("repair", "delete"), ("scope", "filter")]):
            refused = await _post(c, csrf, fields)
            assert refused.status_code == 403 and "read-only" in refused.text, fields
    assert await _counts(broker, "orders") == (0, 1, 0, 0)


# ---- in a real browser ---------------------------------------------------------------------------


@browser
async def test_in_a_real_browser_every_match_is_requeued_with_its_progress(
        tmp_path: Path, prefix: str) -> None:
    """On PostgreSQL and SQLite, in one browser: 1,000 dead letters selected by their
    filter, requeued by a job whose page shows its progress and exact count, and none left
    dead; then a message's timeline."""
    from playwright.async_api import async_playwright

    urls = [url_for(kind, tmp_path) for kind in ("postgresql", "sqlite")]
    brokers = [Broker(url, table_prefix=prefix) for url in urls]
    served: list[tuple[asyncio.subprocess.Process, int]] = []
    problems: list[str] = []
    try:
        kept = []
        for broker in brokers:
            await broker.migrate()
            await _archived(broker, "orders", 1000)
            kept += await _archived(broker, "orders", 1, Outcome.CANCEL, "cancelled")
        served = list(await asyncio.gather(*(_serve("--url", url, "--prefix", prefix)
                                             for url in urls)))
        async with async_playwright() as p:
            chromium = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                for broker, (_, port), one in zip(brokers, served, kept, strict=True):
                    page = await chromium.new_page()
                    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                    page.on("console", lambda m: problems.append(
                        f"console: {m.text} {m.location}") if m.type == "error" else None)
                    await _requeue_every_match(page, f"http://127.0.0.1:{port}", broker, one)
            finally:
                await chromium.close()
    finally:
        for proc, _ in served:
            await _stop(proc)
        for broker, url in zip(brokers, urls, strict=True):
            await broker.close()
            drop_tables(url, prefix)
    assert problems == []


async def _requeue_every_match(page: Any, base: str, broker: Broker, kept: int) -> None:
    from playwright.async_api import expect

    await page.goto(f"{base}/archive?queue=orders&state=FAILED")
    requeue = page.locator('form[data-bulk] button[value="requeue"]')
    await expect(requeue).to_be_disabled()  # nothing selected yet
    await page.locator("[data-select-page]").check()
    await expect(page.locator("[data-selected]")).to_have_text("50 selected")
    await page.locator("[data-select-matching]").check()
    await expect(page.locator("[data-selected]")).to_have_text(
        "every archived message matching this filter")
    await requeue.click()
    await expect(page.locator(".confirm .question")).to_have_text(
        "Requeue 1,000 dead letters of queue 'orders' matching state FAILED? They all run "
        "again.")
    await page.locator(".confirm button").click()
    await page.wait_for_url(re.compile(r".*/operations/[0-9a-f]+$"))
    assert await page.locator("progress[data-progress]").count() == 1
    await expect(page.locator("[data-result]")).to_have_text(
        "Requeued 1,000 dead letters of queue 'orders' matching state FAILED.", timeout=30_000)
    await expect(page.locator("[data-progress-text]")).to_have_text("1,000 of 1,000 done")
    assert await page.locator("progress").evaluate("p => p.value") == 1000
    assert await _counts(broker, "orders") == (1000, 0, 1, 0)  # live again; none left dead
    assert await broker.insights().archive_count(
        ArchiveQuery(queue="orders", states=("FAILED",))) == 0

    await page.goto(f"{base}/messages/{kept}")
    row = page.locator("#timeline tr.attempt")
    await expect(row).to_have_count(1)
    assert await row.get_attribute("data-ended") == "cancelled"
    assert await row.locator("svg.bar rect").count() == 1
