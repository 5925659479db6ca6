"""The search: ``Insights.search`` on every engine (a message by id, live or archived; the
archive by the words of its errors and header values, through each database's text
index, kept as rows are archived, requeued and purged), the dashboard's search box and
results page over HTTP, the index PostgreSQL's plan reads, an upgrade from version 25
that indexes the rows archived before it, and, in a real browser on PostgreSQL and
SQLite, the overview's charts with their legends, and a search by id and by words."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text, update

from sqlmq import Broker, Outcome, Settlement
from sqlmq.dashboard import create_app
from sqlmq.engines.memory.engine import MemoryEngine
from sqlmq.search import MAX_TEXT, MAX_WORDS, matches, read, searchable_text, words

from .conftest import drop_tables, on_every_engine, update_row, url_for
from .test_dashboard import CHROMIUM, _serve, _stop, browser

GATEWAY = "TimeoutError: payment gateway did not answer in 10 s"


async def _archive(broker: Broker, queue: str, outcome: Outcome, *,
                   headers: dict[str, str] | None = None, error: str | None = None) -> int:
    (msg_id,) = await broker.publish_batch(queue, [{"q": queue}], headers=headers)
    (d,) = await broker.engine.acquire([queue], 1, 30)
    assert d.id == msg_id
    assert await broker.engine.settle([Settlement(d.id, 1, outcome, error=error)]) == {msg_id}
    return msg_id


async def _seed(broker: Broker) -> dict[str, int]:
    return {
        "gateway": await _archive(broker, "orders", Outcome.FAIL, error=GATEWAY,
                                  headers={"tenant": "acme-corp", "order": "A-4411"}),
        "globex": await _archive(broker, "orders", Outcome.COMPLETE,
                                 headers={"tenant": "globex", "order": "B-77"}),
        "plain": await _archive(broker, "emails", Outcome.COMPLETE),
        "cancelled": await _archive(broker, "emails", Outcome.CANCEL,
                                    error="ValueError: user_identifier missing"),
        "live": await broker.publish("orders", {"live": True}, headers={"tenant": "acme-corp"}),
    }


async def _edit_archived(broker: Broker, msg_id: int, **values: Any) -> None:
    """Change an archived row behind sqlmq's back, as a hand edit would."""
    engine = broker.engine
    if isinstance(engine, MemoryEngine):
        with engine._lock:
            for name, value in values.items():
                setattr(engine._store.archive[msg_id], name, value)
        return
    a = broker.schema.archive
    async with broker.db.begin() as conn:
        await conn.execute(update(a).where(a.c.id == msg_id).values(**values))


def test_words_are_runs_of_letters_and_digits_and_match_a_words_beginning() -> None:
    assert words("TimeoutError: gateway api.example.com/v2 user_id 10 s Gateway") == [
        "timeouterror", "gateway", "api", "example", "com", "user"]
    text = searchable_text({"content-type": "application/json", "order": "A-4411"}, GATEWAY)
    assert text == f"A-4411 {GATEWAY}"
    assert matches(["time", "gatew", "4411"], text) and not matches(["json"], text)
    assert not matches(["ateway"], text)  # a word's beginning, not any part of it
    assert searchable_text(["not", "a", "mapping"], "boom") == "boom"
    assert read("#42").id == 42 and read("4411").words == ["4411"]
    with pytest.raises(ValueError, match="nothing to look for"):
        read("  ")
    with pytest.raises(ValueError, match="no word of 3 or more"):
        read("ab 1 x")
    with pytest.raises(ValueError, match=f"at most {MAX_TEXT} characters"):
        read("x" * (MAX_TEXT + 1))
    with pytest.raises(ValueError, match=f"at most {MAX_WORDS} words"):
        read(" ".join(f"word{i}" for i in range(MAX_WORDS + 1)))


@on_every_engine
async def test_a_search_finds_a_message_by_id_and_the_archive_by_its_words(
        broker: Broker) -> None:
    ids = await _seed(broker)
    insights = broker.insights()

    live = await insights.search(str(ids["live"]))
    assert live.id == ids["live"] and live.message is not None and live.message.live
    archived = await insights.search(f"#{ids['gateway']}")
    assert archived.message is not None and archived.message.state == "FAILED"
    unknown = await insights.search("987654321")
    assert (unknown.id, unknown.message, unknown.items) == (987654321, None, [])
    assert unknown.words == ["987654321"]  # a number is looked for as a word too

    def found(text: str) -> list[int]:
        return [v.id for v in result[text].items]

    result = {t: await insights.search(t) for t in (
        "gateway", "GATEW timeout", "did not answer in 10 s", "acme", "acme globex",
        "4411", "A-4411", "corp acme", "identifier", "user_identifier", "json",
        "application", "ateway", "nothing-like-this")}
    assert found("gateway") == found("GATEW timeout") == [ids["gateway"]]
    assert found("did not answer in 10 s") == [ids["gateway"]]  # short words left out
    assert found("acme") == found("4411") == found("A-4411") == [ids["gateway"]]
    assert found("corp acme") == [ids["gateway"]]  # any order: every word, somewhere
    assert found("acme globex") == []  # every word, not any
    assert found("identifier") == found("user_identifier") == [ids["cancelled"]]
    assert found("json") == found("application") == []  # content-type is not searched
    assert found("ateway") == found("nothing-like-this") == []
    assert result["4411"].message is None  # no message has that id
    row = result["gateway"].items[0]
    assert (row.queue, row.error, row.headers["order"]) == ("orders", GATEWAY, "A-4411")

    with pytest.raises(ValueError, match="no word of 3"):
        await insights.search("ab")
    with pytest.raises(ValueError, match="1 to 500"):
        await insights.search("acme", limit=0)


@on_every_engine
async def test_the_index_follows_requeues_purges_edits_and_pages(broker: Broker) -> None:
    failed = [await _archive(broker, "orders", Outcome.FAIL, error=f"gateway timeout {i}")
              for i in range(3)]
    insights = broker.insights()
    first = await insights.search("gateway", limit=2)
    assert [v.id for v in first.items] == failed[:0:-1] and first.next == failed[1]
    rest = await insights.search("gateway", limit=2, before=first.next)
    assert [v.id for v in rest.items] == [failed[0]] and rest.next is None

    assert await broker.requeue(ids=[failed[2]]) == 1  # live again: not in the archive
    assert [v.id for v in (await insights.search("gateway")).items] == failed[1::-1]
    await _edit_archived(broker, failed[1], error="connection refused")
    assert [v.id for v in (await insights.search("gateway")).items] == [failed[0]]
    assert [v.id for v in (await insights.search("refused")).items] == [failed[1]]
    assert await broker.purge(older_than=timedelta(0), queue="orders") == 2
    assert (await insights.search("gateway refused")).items == []
    assert (await insights.search("gateway")).items == []


async def test_headers_a_hand_edit_broke_neither_stop_the_archive_nor_the_search(
        broker: Broker) -> None:
    """On the databases, where a row can be edited by hand (the in-memory engine's rows
    are only ever sqlmq's)."""
    msg_id = await broker.publish("orders", {"n": 1}, headers={"tenant": "acme"})
    await update_row(broker, msg_id, headers=["not", "an", "object"])
    assert (await broker.cancel(msg_id)).outcome == "cancelled"  # archived all the same
    await _edit_archived(broker, msg_id, error="hand edited gateway")
    (found,) = (await broker.insights().search("gateway")).items
    assert found.id == msg_id and found.state == "CANCELLED"
    assert (await broker.insights().search("acme")).items == []


# ---- the dashboard ---------------------------------------------------------------------------


@on_every_engine
async def test_the_search_box_opens_a_message_or_lists_the_archive(broker: Broker) -> None:
    ids = await _seed(broker)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(broker)),
                                 base_url="http://127.0.0.1") as client:
        overview = await client.get("/")
        assert re.search(r'<form class="search" method="get" action="/search"', overview.text)
        for key in ("live", "gateway"):
            jump = await client.get("/search", params={"q": f" {ids[key]} "})
            assert (jump.status_code, jump.headers["location"]) == (303,
                                                                     f"/messages/{ids[key]}")
        unknown = await client.get("/search", params={"q": "987654321"})
        assert unknown.status_code == 404
        assert "No message has id 987654321" in unknown.text

        listed = await client.get("/search", params={"q": "Gateway timeout"})
        assert listed.status_code == 200
        assert re.findall(r'<tr data-id="(\d+)">', listed.text) == [str(ids["gateway"])]
        assert "TimeoutError: payment gateway" in listed.text and "A-4411" in listed.text
        assert 'value="Gateway timeout"' in listed.text  # the box keeps what was asked
        by_header = await client.get("/search", params={"q": "globex"})
        assert re.findall(r'<tr data-id="(\d+)">', by_header.text) == [str(ids["globex"])]
        none = await client.get("/search", params={"q": "zebra quagga"})
        assert none.status_code == 200 and 'id="nothing-found"' in none.text

        for params, problem in (({}, "q: missing"), ({"q": "ab"}, "no word of 3"),
                                ({"q": "x" * 1001}, "at most 1000 characters"),
                                ({"q": "acme", "before": "soon"}, "not a message id"),
                                ({"q": "a\x00b"}, "NUL")):
            bad = await client.get("/search", params=params)
            assert bad.status_code == 400 and problem in bad.text, (params, bad.text[:300])
            assert (await client.get("/api/search", params=params)).json()["status"] == 400

        api = (await client.get("/api/search", params={"q": "acme"})).json()
        assert [i["id"] for i in api["items"]] == [ids["gateway"]]
        assert api["words"] == ["acme"] and api["next"] is None and api["message"] is None
        assert api["items"][0]["headers"]["tenant"] == "acme-corp"
        by_id = (await client.get("/api/search", params={"q": str(ids["live"])})).json()
        assert by_id["message"]["id"] == ids["live"] and by_id["items"] == []


async def test_a_page_of_results_links_to_the_older_ones(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlmq.dashboard import search

    failed = [await _archive(broker, "orders", Outcome.FAIL, error="gateway down")
              for _ in range(3)]
    monkeypatch.setattr(search, "SHOWN", 2)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(broker)),
                                 base_url="http://127.0.0.1") as client:
        page = await client.get("/search", params={"q": "gateway"})
        link = re.search(r'rel="next" href="/search\?([^"]+)"', page.text)
        assert link, page.text
        older = await client.get("/search?" + link.group(1).replace("&amp;", "&"))
    assert re.findall(r'<tr data-id="(\d+)">', page.text) == [str(i) for i in failed[:0:-1]]
    assert re.findall(r'<tr data-id="(\d+)">', older.text) == [str(failed[0])]


# ---- PostgreSQL's plan -------------------------------------------------------------------------


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_a_search_reads_the_text_index_on_postgresql(broker: Broker) -> None:
    """A rare word and a word of a third of the rows alike: the planner, left to itself,
    read the primary key backwards for the newest, checking every row's words."""
    a = broker.schema.archive.name
    async with broker.db.begin() as conn:  # 50,000 archived rows; one in 5,000 has the word
        await conn.execute(text(f"""
            INSERT INTO {a} (id, queue, headers, payload, state, attempts_count,
                             deliveries_count, created_at, archived_at, error)
            SELECT g, 'q' || (g % 10),
                   jsonb_build_object('content-type', 'application/json', 'order', 'o' || g),
                   '\\x00'::bytea, CASE WHEN g % 3 = 0 THEN 'FAILED' ELSE 'COMPLETED' END,
                   1, 1, now(), now(),
                   CASE WHEN g % 3 = 0 THEN
                        CASE WHEN g % 5000 = 0 THEN 'TimeoutError: gateway ' || g
                             ELSE 'ValueError: bad input ' || g END END
            FROM generate_series(1, 50000) AS g
        """))
        await conn.execute(text(f"ANALYZE {a}"))
        found = {}
        for word in ("gatew", "bad"):
            stmt = broker.engine.archive_text_search([word], 50, None)  # type: ignore[attr-defined]
            sent = stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
            raw = (await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sent}")).scalar_one()
            plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
            nodes = [plan]
            for node in nodes:
                nodes.extend(node.get("Plans", []))
            assert f"ix_{a}_search" in {n.get("Index Name") for n in nodes}, (word, nodes)
            assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], (word, nodes)
            found[word] = [r.id for r in (await conn.execute(stmt)).all()]
    assert found["gatew"] == [45000, 30000, 15000]
    assert found["bad"] == [g for g in range(49998, 0, -3) if g % 5000][:50]


# ---- an upgrade ---------------------------------------------------------------------------------


def _without_search_index(conn: Any, schema: Any) -> None:
    """Take the archive back to version 25: no search index, and version 26 unrecorded."""
    a = schema.archive.name
    kind = conn.dialect.name
    if kind == "postgresql":
        conn.exec_driver_sql(f"DROP INDEX ix_{a}_search")
    elif kind == "sqlite":
        conn.exec_driver_sql(f"DROP TABLE {a}_search")
        for trigger in ("insert", "delete", "update"):
            conn.exec_driver_sql(f"DROP TRIGGER {a}_search_{trigger}")
    else:
        conn.exec_driver_sql(f"ALTER TABLE {a} DROP INDEX ft_{a}_search, "
                             "DROP COLUMN search_text")
    conn.exec_driver_sql(f"DELETE FROM {schema.version.name} WHERE version = 26")


async def test_the_upgrade_to_26_indexes_the_archive_it_finds(broker: Broker) -> None:
    async with broker.db.begin() as conn:
        await conn.run_sync(_without_search_index, broker.schema)
    before = await _archive(broker, "orders", Outcome.FAIL, error="gateway before",
                            headers={"tenant": "acme"})
    assert await broker.migrate() == 26
    after = await _archive(broker, "orders", Outcome.FAIL, error="gateway after")
    found = await broker.insights().search("gateway")
    assert [v.id for v in found.items] == [after, before]
    assert [v.id for v in (await broker.insights().search("acme")).items] == [before]
    assert await broker.migrate() == 26  # again: nothing to do


# ---- in a real browser ---------------------------------------------------------------------------


async def _in_the_browser(page: Any, base: str, broker: Broker, ids: dict[str, int]) -> None:
    """On one database's dashboard: the overview's chart draws with the latest figures in
    its legend (and so do a queue's charts), the sparklines draw, a refresh keeps the
    chart, and the search box opens a message by id and lists the archive by words."""
    from playwright.async_api import expect

    await page.goto(f"{base}/")
    canvas = await page.wait_for_selector('[data-chart="overview"] canvas', timeout=20_000)
    legend = page.locator('[data-chart="overview"] .u-legend .u-series')
    values = await legend.locator(".u-value").all_inner_texts()
    labels = await legend.locator(".u-label").all_inner_texts()
    assert labels == ["UTC", "completed/min", "failed/min"]
    assert "–" not in values, values  # the latest figures, with no hovering
    assert float(values[1]) == 5.0 and float(values[2]) == 2.0, values
    for queue in ("orders", "emails", "billing"):
        spark = page.locator(f'tr[data-queue="{queue}"] svg.spark polyline.line')
        assert len((await spark.get_attribute("points") or "").split()) == 60
        box = await spark.bounding_box()
        assert box is not None and box["width"] > 100
    await broker.publish("orders", {"more": True})  # the page refreshes itself
    pending = page.locator('tr[data-queue="orders"] [data-col="pending"]')
    await expect(pending).to_have_text("2", timeout=20_000)
    assert await canvas.evaluate("c => c.isConnected")  # the same chart, kept, not redrawn

    await page.goto(f"{base}/queue?name=orders")  # every chart's legend, not only the overview's
    for chart in ("throughput", "latency", "backlog"):
        await page.wait_for_selector(f'[data-chart="{chart}"] canvas', timeout=20_000)
        shown = await page.locator(f'[data-chart="{chart}"] .u-legend .u-value').all_inner_texts()
        assert shown and "–" not in shown, (chart, shown)

    search = page.locator("header form.search input")
    await search.fill(str(ids["gateway"]))
    await search.press("Enter")
    await page.wait_for_url(f"{base}/messages/{ids['gateway']}", timeout=20_000)
    assert (await page.locator("h1").inner_text()) == f"Message {ids['gateway']}"

    await page.locator("header form.search input").fill("payment gateway")
    await page.locator("header form.search input").press("Enter")
    await page.wait_for_url(re.compile(r".*/search\?q=payment\+gateway$"), timeout=20_000)
    hit = page.locator(f'#results tr[data-id="{ids["gateway"]}"]')
    await expect(hit).to_contain_text("TimeoutError: payment gateway")
    assert await page.locator("#results tbody tr").count() == 1


@browser
async def test_in_a_real_browser_the_charts_draw_and_the_search_finds(
        tmp_path: Any, prefix: str) -> None:
    """PostgreSQL and SQLite, each served by ``sqlmq dashboard``, in one browser."""
    from playwright.async_api import async_playwright

    urls = [url_for("postgresql", tmp_path), url_for("sqlite", tmp_path)]
    brokers = [Broker(url, table_prefix=prefix) for url in urls]
    served: list[Any] = []
    problems: list[str] = []
    try:
        seeded = []
        for broker in brokers:
            await broker.migrate()
            seeded.append(await _seed(broker))
            for _ in range(3):
                await _archive(broker, "billing", Outcome.COMPLETE)
        served = await asyncio.gather(*(_serve("--url", url, "--prefix", prefix, "--refresh",
                                               "1") for url in urls))
        async with async_playwright() as p:
            chromium = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = await chromium.new_page()
                page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                page.on("console", lambda m: problems.append(
                    f"console: {m.text} {m.location}") if m.type == "error" else None)
                for (_, port), broker, ids in zip(served, brokers, seeded, strict=True):
                    await _in_the_browser(page, f"http://127.0.0.1:{port}", broker, ids)
            finally:
                await chromium.close()
    finally:
        for proc, _ in served:
            await _stop(proc)
        for broker, url in zip(brokers, urls, strict=True):
            await broker.close()
            drop_tables(url, prefix)
    assert problems == []
