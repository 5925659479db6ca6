"""Every entry of a message's delivery history says when it happened, on the database's
clock, whichever statement wrote it (a retry, an archive, a defer, a cancellation, an
expiry); the dashboard's message page shows those times."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from sqlmq import Broker, Message, Retry
from sqlmq.dashboard import create_app

from .conftest import drained, on_every_engine, rows, wait_until

pytestmark = on_every_engine

FAST: dict[str, Any] = {"flush_interval": 0.01, "max_fetch_interval": 0.05}


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


async def _run(broker: Broker) -> dict[str, int]:
    """One message per way a history entry is written, run to the archive; their ids."""

    @broker.subscriber("jobs", retry=Retry.constant(0.01, max_attempts=3), **FAST)
    async def handle(msg: Message) -> None:
        kind = msg.body
        if (kind == "fails twice" and msg.attempts < 2) or kind == "always fails":
            raise ValueError(kind)
        if kind == "deferred, then rejected":
            if msg.defers == 0:
                await msg.defer()
            else:
                await msg.reject("no")
        if kind == "nacked once" and msg.attempts == 0:
            await msg.nack(0.01)

    ids = {kind: await broker.publish("jobs", kind) for kind in (
        "fails twice", "always fails", "deferred, then rejected", "nacked once")}
    ids["expired"] = await broker.publish(
        "jobs", "expired", expires=datetime.now(UTC) - timedelta(hours=1))
    ids["cancelled"] = await broker.publish("jobs", "cancelled", delay=3600)
    await broker.cancel(ids["cancelled"])
    await broker.start()
    try:
        await wait_until(lambda: drained(broker, "jobs"), message="every message archived")
    finally:
        await broker.stop()
    return ids


async def test_every_history_entry_has_its_time_and_the_message_page_shows_it(
    broker: Broker,
) -> None:
    ids = await _run(broker)
    archive = {r["id"]: r for r in await rows(broker, "archive")}
    endings = {kind: [e["ended"] for e in archive[i]["history"]] for kind, i in ids.items()}
    assert endings == {
        "fails twice": ["error", "error"],
        "always fails": ["error", "error", "error"],
        "deferred, then rejected": ["deferred", "rejected"],
        "nacked once": ["nacked"],
        "expired": ["expired"],
        "cancelled": ["cancelled"],
    }
    for kind, msg_id in ids.items():
        row = archive[msg_id]
        assert all("at" in e for e in row["history"]), (kind, row["history"])
        times = [datetime.fromisoformat(e["at"]) for e in row["history"]]
        assert times == sorted(times), (kind, row["history"])
        assert _utc(row["created_at"]) <= times[0], kind
        assert times[-1] <= _utc(row["archived_at"]), kind

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(broker)),
                                 base_url="http://127.0.0.1") as client:
        for msg_id in (ids["always fails"], ids["deferred, then rejected"]):
            page = await client.get(f"/messages/{msg_id}")
            assert page.status_code == 200
            shown = re.findall(r'<tr><td>(\d+)</td><td class="name">(\w+)</td><td>([^<]*)</td>',
                               page.text)
            assert shown == [(str(e["delivery"]), e["ended"], html.escape(e["at"]))
                             for e in archive[msg_id]["history"]]
