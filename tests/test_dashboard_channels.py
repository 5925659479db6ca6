"""The dashboard's channel pages, on the three databases: every channel by queue with its
limits (its own or its queue's default), what waits and runs in it, what it served and
how long its oldest message has waited, sortable; one channel with its live messages; a
channel's limits and a queue's default set and reset by confirmed POSTs, bad input a 400
that changes nothing, and a read-only dashboard refusing each write."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx

from sqlmq import Broker
from sqlmq.channels import ChannelSettings
from sqlmq.dashboard import create_app
from sqlmq.lifecycle import Outcome
from sqlmq.records import Settlement

from .test_dashboard import _client, _csrf, _post, client  # noqa: F401 (client: a fixture)


async def seed_channels(broker: Broker) -> dict[str, Any]:
    """orders: tenant-1 (its own max_concurrency 2: 3 waiting, 1 running), tenant-2 (the
    queue's default rate 5: 1 waiting, 2 served); emails: none, a default max_size 10."""
    await broker.set_channel("tenant-1", queue="orders", max_concurrency=2)
    await broker.set_channel_default("orders", rate=5)
    await broker.set_channel_default("emails", max_size=10)
    one = await broker.publish_batch("orders", [{"n": i} for i in range(4)], channel="tenant-1")
    two = await broker.publish_batch("orders", [{"n": i} for i in range(3)], channel="tenant-2")
    taken = await broker.engine.acquire(["orders"], 10, 30)
    # tenant-1's limit lets 2 start, tenant-2's rate 1: settle one of tenant-1's, the other
    # running, and tenant-2's; then take tenant-2's next when its rate lets it
    by_channel = {d.id: ("tenant-1" if d.id in one else "tenant-2") for d in taken}
    ended = [d for d in taken if by_channel[d.id] == "tenant-2"]
    running = [d for d in taken if by_channel[d.id] == "tenant-1"]
    await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE)
                                for d in [*ended, running[0]]])
    return {"one": one, "two": two, "running": running[1].id, "ended": len(ended)}


def _cells(page: str, channel: str) -> dict[str, str]:
    found = re.search(rf'<tr data-channel="{re.escape(html.escape(channel))}">(.*?)</tr>',
                      page, re.S)
    assert found, f"no row for channel {channel!r}"
    return {k: html.unescape(re.sub(r"<[^>]+>", "", v)).strip()
            for k, v in re.findall(r'data-col="(\w+)"[^>]*>(.*?)</td>', found.group(1), re.S)}


async def test_the_channels_page_shows_each_channel_by_queue_with_limits_and_counts(
        broker: Broker, client: httpx.AsyncClient) -> None:  # noqa: F811
    seeded = await seed_channels(broker)
    page = await client.get("/channels")
    assert page.status_code == 200 and 'class="on">Channels' in page.text
    one, two = _cells(page.text, "tenant-1"), _cells(page.text, "tenant-2")
    assert (one["limits"], one["waiting"], one["running"]) == ("max concurrency 2", "2", "1")
    assert (two["limits"], two["waiting"], two["running"]) == (
        "rate 5/s", str(3 - seeded["ended"]), "0")
    assert float(two["served"]) == seeded["ended"]  # per minute, over the last minute
    assert re.fullmatch(r"\d+s", two["oldest"]), two
    assert 'data-queue="emails"' in page.text and "default: max size 10" in page.text
    assert 'href="/channel?name=tenant-1"' in page.text

    as_json = (await client.get("/api/channels")).json()
    found = {c["name"]: c for c in as_json["channels"]}
    assert found["tenant-1"]["own"] == {"max_concurrency": 2, "rate": None, "ordered": False,
                                        "max_size": None}
    assert found["tenant-2"]["own"] is None and found["tenant-2"]["effective"]["rate"] == 5
    assert found["tenant-2"]["served_per_second"] == seeded["ended"] / 60
    assert as_json["queue_defaults"]["emails"]["max_size"] == 10

    def order(text: str) -> list[str]:
        return re.findall(r'<tr data-channel="([^"]+)">', text)

    assert order((await client.get("/channels?sort=name")).text) == ["tenant-1", "tenant-2"]
    by_waiting = order((await client.get("/channels?sort=waiting")).text)
    assert by_waiting == sorted(["tenant-1", "tenant-2"],
                                key=lambda n: -int(_cells(page.text, n)["waiting"]))
    assert order((await client.get("/channels?sort=running")).text) == ["tenant-1", "tenant-2"]
    assert order((await client.get("/partials/channels?sort=running")).text)[0] == "tenant-1"
    bad = await client.get("/channels?sort=size")
    assert bad.status_code == 400 and "sort: &#39;size&#39; is not one of" in bad.text


async def test_a_channels_page_lists_its_live_messages(
        broker: Broker, client: httpx.AsyncClient) -> None:  # noqa: F811
    seeded = await seed_channels(broker)
    page = await client.get("/channel", params={"name": "tenant-1"})
    assert page.status_code == 200
    listed = [int(i) for i in re.findall(r'<tr data-id="(\d+)">', page.text)]
    assert listed == sorted(seeded["one"][1:])  # the first one ended
    assert f'href="/messages/{seeded["running"]}"' in page.text
    assert "max concurrency 2" in page.text and "rate 5/s" in page.text  # own and default
    as_json = (await client.get("/api/channel", params={"name": "tenant-1"})).json()
    assert [m["id"] for m in as_json["messages"]] == listed
    assert {m["state"] for m in as_json["messages"]} == {"PENDING", "PROCESSING"}
    missing = await client.get("/channel", params={"name": "nope"})
    assert missing.status_code == 404 and "no channel named &#39;nope&#39;" in missing.text
    assert (await client.get("/api/channel", params={"name": "nope"})).status_code == 404
    assert (await client.get("/channel")).status_code == 400


async def _settings(broker: Broker, name: str) -> ChannelSettings | None:
    return next(c.settings for c in await broker.channels() if c.name == name)


async def test_limits_are_set_and_reset_once_confirmed_and_bad_input_changes_nothing(
        broker: Broker, client: httpx.AsyncClient) -> None:  # noqa: F811
    await seed_channels(broker)
    page = await client.get("/channel", params={"name": "tenant-2"})
    csrf = _csrf(page.text)
    limits = {"channel": "tenant-2", "max_concurrency": "3", "rate": "2.5", "ordered": "yes",
              "max_size": ""}
    asked = await _post(client, "/actions/channel/limits", csrf, confirmed=False, **limits)
    assert asked.status_code == 200 and 'name="confirmed" value="1"' in asked.text
    assert ("Set the limits of channel &#39;tenant-2&#39; (queue &#39;orders&#39;) to: max "
            "concurrency 3, rate 2.5/s, ordered?") in asked.text
    assert await _settings(broker, "tenant-2") is None  # nothing done yet
    done = await _post(client, "/actions/channel/limits", csrf, **limits)
    assert (done.status_code, done.headers["location"]) == (303, "/channel?name=tenant-2")
    assert await _settings(broker, "tenant-2") == ChannelSettings(3, 2.5, True, None)
    shown = await client.get("/channel", params={"name": "tenant-2"})
    assert "Channel &#39;tenant-2&#39;: max concurrency 3, rate 2.5/s, ordered." in shown.text

    for field, value, said in (("max_concurrency", "two", "max_concurrency: &#39;two&#39; is "
                                                          "not a whole number"),
                               ("max_concurrency", "0", "max_concurrency: 0 is below 1"),
                               ("rate", "-1", "rate: &#39;-1&#39; is not a positive number"),
                               ("rate", "inf", "rate: &#39;inf&#39; is not a positive"),
                               ("ordered", "maybe", "ordered: &#39;maybe&#39; is not yes or no"),
                               ("max_size", "1.5", "max_size: &#39;1.5&#39; is not a whole")):
        bad = await _post(client, "/actions/channel/limits", csrf, **{**limits, field: value})
        assert bad.status_code == 400 and said in bad.text, (field, value, bad.text[-600:])
    assert await _settings(broker, "tenant-2") == ChannelSettings(3, 2.5, True, None)
    unknown = await _post(client, "/actions/channel/limits", csrf, **{**limits,
                                                                      "channel": "nope"})
    assert unknown.status_code == 404 and "no channel named" in unknown.text

    reset = await _post(client, "/actions/channel/reset", csrf, channel="tenant-2")
    assert reset.status_code == 303 and await _settings(broker, "tenant-2") is None
    again = await _post(client, "/actions/channel/reset", csrf, channel="tenant-2")
    assert again.status_code == 409 and "no limits of its own" in again.text

    default = await _post(client, "/actions/channel-default/limits", csrf, queue="orders",
                          max_concurrency="1", rate="", ordered="no", max_size="50")
    assert default.status_code == 303 and default.headers["location"] == "/channels"
    assert (await broker.channel_defaults())["orders"] == ChannelSettings(1, None, False, 50)
    gone = await _post(client, "/actions/channel-default/reset", csrf, queue="emails")
    assert gone.status_code == 303 and "emails" not in await broker.channel_defaults()
    none = await _post(client, "/actions/channel-default/reset", csrf, queue="emails")
    assert none.status_code == 409 and "no channel default" in none.text
    bad_queue = await _post(client, "/actions/channel-default/limits", csrf, queue="q" * 1000)
    assert bad_queue.status_code == 400 and "queue:" in bad_queue.text


async def test_a_read_only_dashboard_offers_and_takes_no_channel_write(broker: Broker) -> None:
    await seed_channels(broker)
    app = create_app(broker, read_only=True)
    async with _client(app) as client:  # noqa: F811
        for path in ("/channels", "/channel?name=tenant-1"):
            page = await client.get(path)
            assert page.status_code == 200 and 'method="post"' not in page.text, path
        csrf = app.state.dashboard.csrf
        for path, fields in (("/actions/channel/limits", {"channel": "tenant-1", "rate": "1"}),
                             ("/actions/channel/reset", {"channel": "tenant-1"}),
                             ("/actions/channel-default/limits", {"queue": "orders",
                                                                  "rate": "1"}),
                             ("/actions/channel-default/reset", {"queue": "orders"})):
            refused = await _post(client, path, csrf, **fields)
            assert refused.status_code == 403 and "read-only" in refused.text, path
    assert await _settings(broker, "tenant-1") == ChannelSettings(max_concurrency=2)
    assert (await broker.channel_defaults())["orders"] == ChannelSettings(rate=5)
