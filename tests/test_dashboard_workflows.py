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
