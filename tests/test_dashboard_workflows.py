"""The dashboard's workflow pages, on the three databases: the list, and a workflow drawn
as its graph, each step a box coloured by its state and linked to its message; an unknown
name is a 404 page and a 404 JSON error."""

from __future__ import annotations

import re

import httpx

from sqlmq import Broker
from sqlmq.lifecycle import Outcome
from sqlmq.records import Settlement

from .test_dashboard import client  # noqa: F401 (a fixture)


async def test_the_workflow_pages_draw_each_step_in_its_state(
        broker: Broker, client: httpx.AsyncClient) -> None:  # noqa: F811
    flow = broker.workflow("order <7>")  # a name the page must escape
    a = flow.add("charge", {"id": 7})
    b = flow.add("ship", {"id": 7}, after=[a])
    c = flow.add("pack", {"id": 7}, after=[a])
    flow.add("email", {"id": 7}, after=[b, c])
    ids = await flow.publish()
    (d,) = await broker.engine.acquire(["charge"], 10, 30)
    assert await broker.engine.settle([Settlement(d.id, 1, Outcome.COMPLETE, step=True)])

    listed = await client.get("/workflows")
    assert listed.status_code == 200
    assert "order &lt;7&gt;" in listed.text and "<7>" not in listed.text
    assert (await client.get("/api/workflows")).json()[0]["name"] == "order <7>"

    page = await client.get("/workflow", params={"name": "order <7>"})
    assert page.status_code == 200
    drawn = dict(re.findall(r'data-step="([^"]+)" data-state="([^"]+)"', page.text))
    assert drawn == {"charge": "COMPLETED", "ship": "PENDING", "pack": "PENDING",
                     "email": "WAITING"}
    assert page.text.count('class="edge"') == 4
    assert f'href="/messages/{ids["email"]}"' in page.text
    as_json = (await client.get("/api/workflow", params={"name": "order <7>"})).json()
    assert [(s["name"], s["after"]) for s in as_json["steps"]] == [
        ("charge", []), ("ship", ["charge"]), ("pack", ["charge"]), ("email", ["pack", "ship"])]

    missing = await client.get("/workflow", params={"name": "nope"})
    assert missing.status_code == 404 and "no workflow is named" in missing.text
    assert (await client.get("/api/workflow", params={"name": "nope"})).status_code == 404


async def test_a_signal_is_sent_from_a_live_message_page(
        broker: Broker, client: httpx.AsyncClient) -> None:  # noqa: F811
    from .test_dashboard import _csrf, _post

    (msg_id,) = await broker.publish_batch("refunds", [{"amount": 30}])
    (d,) = await broker.engine.acquire(["refunds"], 10, 30)
    assert await broker.engine.settle([Settlement(d.id, 1, Outcome.DEFER, delay=3600,
                                                  waits_for="approved")])
    page = await client.get(f"/messages/{msg_id}")
    assert 'action="/actions/signal"' in page.text
    csrf = _csrf(page.text)
    bad = await _post(client, "/actions/signal", csrf, id=msg_id, name="approved",
                      payload="{nope")
    assert bad.status_code == 400 and "payload: not JSON" in bad.text
    asked = await _post(client, "/actions/signal", csrf, confirmed=False, id=msg_id,
                        name="approved", payload='{"by": "ann"}')
    assert asked.status_code == 200 and "Send signal &#39;approved&#39; to message" in asked.text
    assert await broker.engine.acquire(["refunds"], 10, 30) == []  # not sent yet
    sent = await _post(client, "/actions/signal", csrf, id=msg_id, name="approved",
                       payload='{"by": "ann"}')
    assert sent.status_code == 303
    (again,) = await broker.engine.acquire(["refunds"], 10, 30)  # due at once
    got = await broker.engine.received_signal(msg_id, again.deliveries)
    assert got is not None and got.payload == {"by": "ann"}
    assert await broker.engine.settle([Settlement(msg_id, again.deliveries,
                                                  Outcome.COMPLETE)])
    ended = await _post(client, "/actions/signal", csrf, id=msg_id, name="approved")
    assert ended.status_code == 409 and "ended already" in ended.text


async def test_a_read_only_dashboard_sends_no_signal(broker: Broker) -> None:
    from sqlmq.dashboard import create_app

    from .test_dashboard import _client, _post

    (msg_id,) = await broker.publish_batch("refunds", [{"amount": 30}])
    app = create_app(broker, read_only=True)
    async with _client(app) as reader:
        page = await reader.get(f"/messages/{msg_id}")
        assert 'action="/actions/signal"' not in page.text
        refused = await _post(reader, "/actions/signal", app.state.dashboard.csrf,
                              id=msg_id, name="approved")
        assert refused.status_code == 403 and "read-only" in refused.text
