"""The dashboard's schedules page, on the three databases: each schedule with its cron or
interval, time zone, catch-up, last and next tick and the message its last tick published;
pausing and resuming one by confirmed POSTs (a paused schedule says so, its next tick
gone); a read-only dashboard refusing both."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import httpx

from sqlmq import Broker
from sqlmq.dashboard import create_app
from sqlmq.records import NewMessage, NewMessages

from .test_dashboard import _client, _csrf, _post, client  # noqa: F401 (client: a fixture)


async def seed_schedules(broker: Broker) -> int:
    """nightly (cron, Europe/Paris, to reports) and beat (every minute, catch-up all, one
    tick published: its message's id returned)."""
    nightly = broker.periodic("nightly", cron="0 3 * * *", tz="Europe/Paris", body=1,
                              queue="reports")
    await broker.engine.register_schedule(nightly)
    beat = broker.periodic("beat", every=timedelta(minutes=1), body=1, catch_up="all")
    info = await broker.engine.register_schedule(beat)

    async def produce() -> NewMessages:
        return NewMessages.of([NewMessage("beat", b"x", {})])

    msg_id = await broker.engine.fire_tick("beat", beat.cadence.after(info.registered_at),
                                           produce)
    assert msg_id is not None
    return msg_id


def _row(page: str, name: str) -> str:
    found = re.search(rf'<tr data-schedule="{re.escape(name)}"[^>]*>(.*?)</tr>', page, re.S)
    assert found, f"no row for schedule {name!r}"
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found.group(1))))


async def test_the_schedules_page_shows_each_schedule_and_pauses_and_resumes_it(
        broker: Broker, client: httpx.AsyncClient) -> None:  # noqa: F811
    msg_id = await seed_schedules(broker)
    page = await client.get("/schedules")
    assert page.status_code == 200 and 'class="on">Schedules' in page.text
    nightly, beat = _row(page.text, "nightly"), _row(page.text, "beat")
    assert "0 3 * * *" in nightly and "Europe/Paris" in nightly and "reports" in nightly
    assert "latest" in nightly and "Pause" in nightly
    assert "every 0:01:00" in beat and " all " in beat and str(msg_id) in beat
    assert f'href="/messages/{msg_id}"' in page.text
    listed = {s["name"]: s for s in (await client.get("/api/schedules")).json()}
    assert (listed["nightly"]["cron"], listed["nightly"]["tz"]) == ("0 3 * * *", "Europe/Paris")
    assert listed["beat"]["every_seconds"] == 60 and listed["beat"]["last_message_id"] == msg_id
    assert listed["nightly"]["next_tick_at"] is not None and listed["nightly"]["paused_at"] is None

    csrf = _csrf(page.text)
    asked = await _post(client, "/actions/schedule/pause", csrf, confirmed=False,
                        name="nightly")
    assert asked.status_code == 200 and 'name="confirmed" value="1"' in asked.text
    assert "Pause schedule &#39;nightly&#39;" in asked.text
    assert not any(s.paused for s in await broker.schedules())  # nothing done yet
    done = await _post(client, "/actions/schedule/pause", csrf, name="nightly")
    assert (done.status_code, done.headers["location"]) == (303, "/schedules")
    assert [s.name for s in await broker.schedules() if s.paused] == ["nightly"]
    shown = await client.get("/schedules")
    assert "Paused schedule &#39;nightly&#39;." in shown.text
    assert "paused since" in _row(shown.text, "nightly") and "Resume" in _row(shown.text,
                                                                               "nightly")
    listed = {s["name"]: s for s in (await client.get("/api/schedules")).json()}
    assert listed["nightly"]["paused_at"] is not None and listed["nightly"]["next_tick_at"] is None
    again = await _post(client, "/actions/schedule/pause", csrf, name="nightly")
    assert again.status_code == 303
    assert "was paused already" in (await client.get("/schedules")).text

    resumed = await _post(client, "/actions/schedule/resume", csrf, name="nightly")
    assert resumed.status_code == 303 and not any(s.paused for s in await broker.schedules())
    missing = await _post(client, "/actions/schedule/pause", csrf, name="nope")
    assert missing.status_code == 404 and "no schedule named &#39;nope&#39;" in missing.text
    assert (await _post(client, "/actions/schedule/resume", csrf)).status_code == 400
    assert "<html" not in (await client.get("/partials/schedules")).text


async def test_a_read_only_dashboard_offers_and_takes_no_schedule_write(
        broker: Broker) -> None:
    await seed_schedules(broker)
    await broker.pause_schedule("beat")
    app = create_app(broker, read_only=True)
    async with _client(app) as client:  # noqa: F811
        page = await client.get("/schedules")
        assert page.status_code == 200 and 'method="post"' not in page.text
        csrf = app.state.dashboard.csrf
        for path, name in (("/actions/schedule/pause", "nightly"),
                           ("/actions/schedule/resume", "beat")):
            refused = await _post(client, path, csrf, name=name)
            assert refused.status_code == 403 and "read-only" in refused.text, path
    assert [s.name for s in await broker.schedules() if s.paused] == ["beat"]
