"""The dashboard's topics page, on the three databases: each consumer group with its
pattern, queue, what waits and runs there and its rates; deleting a group by a confirmed
POST (the confirmation names it and what it deletes); a read-only dashboard refusing it."""

from __future__ import annotations

import html
import re

import httpx

from sqlmq import Broker, Outcome, Settlement
from sqlmq.dashboard import create_app

from .test_dashboard import _client, _csrf, _post, client  # noqa: F401 (client: a fixture)


async def seed_groups(broker: Broker) -> None:
    """billing and audit of orders.*, two topic publishes; billing ran one copy."""
    await broker.join_group("orders.*", "billing")
    await broker.join_group("orders.#", "audit")
    await broker.publish_topic("orders.created", {"id": 1})
    await broker.publish_topic("orders.paid", {"id": 1})
    (d, *_) = await broker.engine.acquire(["billing@orders.*"], 1, 30)
    await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE)])


def _row(page: str, group: str) -> dict[str, str]:
    found = re.search(rf'<tr data-group="{group}"[^>]*>(.*?)</tr>', page, re.S)
    assert found, f"no row for group {group!r}"
    cells = dict(re.findall(r'data-col="(\w+)"[^>]*>(.*?)</td>', found.group(1), re.S))
    cells["text"] = html.unescape(re.sub(r"<[^>]+>", " ", found.group(1)))
    return cells


async def test_the_topics_page_shows_each_group_and_deletes_one_once_confirmed(
        broker: Broker, client: httpx.AsyncClient) -> None:  # noqa: F811
    await seed_groups(broker)
    page = await client.get("/groups")
    assert page.status_code == 200 and 'class="on">Topics' in page.text
    billing, audit = _row(page.text, "billing"), _row(page.text, "audit")
    assert (billing["waiting"], billing["running"]) == ("1", "0")
    assert (audit["waiting"], audit["running"]) == ("2", "0")
    assert "orders.*" in billing["text"] and "billing@orders.*" in billing["text"]
    assert 'href="/queue?name=billing%40orders.%2A"' in page.text
    listed = {g["group"]: g for g in (await client.get("/api/groups")).json()}
    assert listed["billing"]["completed_per_minute"]["1m"] == 1.0
    assert (listed["audit"]["queue"], listed["audit"]["waiting"]) == ("audit@orders.#", 2)

    csrf = _csrf(page.text)
    asked = await _post(client, "/actions/group/delete", csrf, confirmed=False,
                        pattern="orders.#", group="audit")
    assert asked.status_code == 200 and 'name="confirmed" value="1"' in asked.text
    assert ("Delete consumer group &#39;audit&#39; of topic &#39;orders.#&#39;? Its queue "
            "&#39;audit@orders.#&#39; gets no more copies, and its 2 waiting") in asked.text
    assert len(await broker.groups()) == 2  # nothing done yet
    done = await _post(client, "/actions/group/delete", csrf, pattern="orders.#",
                       group="audit")
    assert (done.status_code, done.headers["location"]) == (303, "/groups")
    assert [g.group for g in await broker.groups()] == ["billing"]
    shown = await client.get("/groups")
    assert "Deleted consumer group &#39;audit&#39; of &#39;orders.#&#39; and 2 message(s)" \
        in shown.text and 'data-group="audit"' not in shown.text
    again = await _post(client, "/actions/group/delete", csrf, pattern="orders.#",
                        group="audit")
    assert again.status_code == 404 and "no consumer group &#39;audit&#39;" in again.text
    assert (await _post(client, "/actions/group/delete", csrf, group="x")).status_code == 400
    assert "<html" not in (await client.get("/partials/groups")).text


async def test_a_read_only_dashboard_offers_and_takes_no_group_write(broker: Broker) -> None:
    await seed_groups(broker)
    app = create_app(broker, read_only=True)
    async with _client(app) as client:  # noqa: F811
        page = await client.get("/groups")
        assert page.status_code == 200 and 'method="post"' not in page.text
        refused = await _post(client, "/actions/group/delete", app.state.dashboard.csrf,
                              pattern="orders.#", group="audit")
        assert refused.status_code == 403 and "read-only" in refused.text
    assert len(await broker.groups()) == 2
