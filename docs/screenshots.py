"""Take the screenshots of docs/dashboard.md: ``.venv/bin/python docs/screenshots.py``.

Seeds a SQLite database in a temporary directory with a few queues (completed messages
spread over the last hour, dead letters with errors, a backlog, a paused queue), starts a
worker on it so the workers page has one, serves the dashboard on a free loopback port and
photographs three pages with headless Chromium (Debian's ``/usr/bin/chromium``, driven by
Playwright) into ``docs/dashboard-*.png``.

The archive times are moved back by hand (an UPDATE of the seeded rows) so the charts show
an hour of traffic without waiting an hour; nothing else is staged.
"""

from __future__ import annotations

import asyncio
import random
import socket
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import uvicorn
from playwright.async_api import async_playwright
from sqlalchemy import update

from sqlmq import ArchiveQuery, Broker, Message, Outcome, Settlement
from sqlmq.dashboard import create_app

DOCS = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
ERRORS = [
    "TimeoutError: payment gateway did not answer in 10 s",
    "ValueError: order 4411 has no shipping address",
    "HTTPError: 503 Service Unavailable from https://api.example.com/charge",
    'KeyError: "sku"\nTraceback (most recent call last):\n  File "app/orders.py", line 88, '
    'in charge\n    sku = item["sku"]\nKeyError: "sku"',
]


async def seed(broker: Broker) -> int:
    """The database the screenshots show; returns the id of a dead letter to photograph."""
    rng = random.Random(7)
    await broker.migrate()
    engine = broker.engine
    for queue, done, failed in (("orders", 900, 14), ("emails", 2400, 3),
                                ("billing@invoices.created", 300, 0)):
        await broker.publish_batch(queue, [{"order": 1000 + i, "total": round(rng.uniform(5, 400),
                                            2), "items": [{"sku": f"A-{i % 17}", "qty": 1}]}
                                           for i in range(done + failed)],
                                   headers={"tenant": "acme", "source": "checkout"})
        taken = await engine.acquire([queue], done + failed, 30)
        await engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL,
                                        error=rng.choice(ERRORS)) for d in taken[:failed]])
        await engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE)
                             for d in taken[failed:]])
    # An hour of traffic: each archived row moved back to a moment of the last hour, busier
    # a quarter of an hour ago, with its creation a realistic latency before it.
    archive = broker.schema.archive
    now = await engine.now()
    async with broker.db.begin() as conn:
        for (msg_id,) in (await conn.execute(archive.select().with_only_columns(
                archive.c.id))).all():
            back = min(3599.0, abs(rng.gauss(900, 700)))
            done_at = now - timedelta(seconds=back)
            latency = rng.lognormvariate(-1.2, 0.9)
            await conn.execute(update(archive).where(archive.c.id == msg_id).values(
                archived_at=done_at, created_at=done_at - timedelta(seconds=latency)))
    await broker.publish_batch("emails", [{"to": f"user{i}@example.com", "template": "welcome"}
                                          for i in range(240)])
    message = broker.schema.message
    async with broker.db.begin() as conn:  # the backlog has waited three minutes
        await conn.execute(update(message).where(message.c.queue == "emails").values(
            next_attempt_at=now - timedelta(minutes=3), created_at=now - timedelta(minutes=3)))
    await broker.publish_batch("orders", [{"order": 9000 + i} for i in range(12)])
    await broker.publish("reports", {"report": "daily-revenue", "day": "2024-05-01"})
    await broker.pause("reports")
    page = await broker.insights().archive(ArchiveQuery(queue="orders", states=("FAILED",),
                                                        error_contains="KeyError", limit=1))
    return page.items[0].id


async def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/shop.db"
        broker = Broker(url)
        dead_id = await seed(broker)
        worker = Broker(url, heartbeat_interval=1.0)

        @worker.subscriber("orders", workers=8, prefetch=4, max_fetch_interval=0.2)
        async def charge(msg: Message) -> None:
            await asyncio.sleep(60)  # busy: the workers page shows handlers running

        await worker.start()
        sock = socket.create_server(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(create_app(broker), log_level="warning",
                                               lifespan="off"))
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        try:
            async with async_playwright() as p:
                browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
                page = await browser.new_page(viewport={"width": 1440, "height": 900})
                await page.goto(f"{base}/")
                await page.screenshot(path=DOCS / "dashboard-overview.png", full_page=True)
                await page.goto(f"{base}/queue?name=orders")
                await page.wait_for_selector('[data-chart="latency"] canvas')
                await page.wait_for_timeout(6000)  # a second backlog sample
                await page.screenshot(path=DOCS / "dashboard-queue.png", full_page=True)
                await page.goto(f"{base}/messages/{dead_id}")
                await page.screenshot(path=DOCS / "dashboard-message.png", full_page=True)
                await browser.close()
        finally:
            server.should_exit = True
            await serving
            await worker.stop(graceful_timeout=0.1)
            await worker.close()
            await broker.close()
    for name in ("overview", "queue", "message"):
        print(DOCS / f"dashboard-{name}.png")
    return 0


if __name__ == "__main__":
    if not Path(CHROMIUM).exists():
        sys.exit(f"needs Chromium at {CHROMIUM}: apt-get install chromium")
    sys.exit(asyncio.run(main()))
