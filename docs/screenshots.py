"""Take the screenshots of docs/dashboard.md: ``.venv/bin/python docs/screenshots.py``.

Seeds a SQLite database in a temporary directory with a few queues (completed messages
spread over the last hour, dead letters with errors, a backlog, a paused queue; channels,
schedules and consumer groups), starts a worker on it so the workers page has one, serves
the dashboard on a free loopback port and photographs seven pages with headless Chromium
(Debian's ``/usr/bin/chromium``, driven by Playwright) into ``docs/dashboard-*.png``.

The archive times are moved back by hand (an UPDATE of the seeded rows) so the charts show
an hour of traffic without waiting an hour; nothing else is staged: the dead letter whose
page is shown went through its three deliveries for real, seconds apart.
"""

from __future__ import annotations

import asyncio
import random
import socket
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

import uvicorn
from playwright.async_api import async_playwright
from sqlalchemy import update

from sqlmq import Broker, Message, Outcome, Schedule, Settlement
from sqlmq.dashboard import create_app
from sqlmq.records import NewMessage, NewMessages

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
                archived_at=done_at, created_at=done_at - timedelta(seconds=latency),
                first_attempt_at=done_at - timedelta(seconds=latency / 3)))
    dead_id = await _three_deliveries(broker)
    await broker.publish_batch("emails", [{"to": f"user{i}@example.com", "template": "welcome"}
                                          for i in range(240)])
    message = broker.schema.message
    async with broker.db.begin() as conn:  # the backlog has waited three minutes
        await conn.execute(update(message).where(message.c.queue == "emails").values(
            next_attempt_at=now - timedelta(minutes=3), created_at=now - timedelta(minutes=3)))
    await broker.publish_batch("orders", [{"order": 9000 + i} for i in range(12)])
    await broker.publish("reports", {"report": "daily-revenue", "day": "2024-05-01"})
    await broker.pause("reports")
    return dead_id


async def _three_deliveries(broker: Broker) -> int:
    """A dead letter of orders that failed twice, retried after a backoff each time, and
    failed for good at its third delivery (its page's timeline)."""
    engine = broker.engine
    msg_id = await broker.publish("orders", {"order": 4411, "total": 129.5,
                                             "items": [{"qty": 2}]},
                                  headers={"tenant": "acme", "source": "checkout"})
    for work, backoff in ((0.4, 1.0), (0.25, 2.0), (0.6, None)):
        (d,) = await engine.acquire(["orders"], 1, 30)
        await asyncio.sleep(work)
        error = ERRORS[3] if backoff is None else ERRORS[0]
        entry = {"delivery": d.deliveries, "ended": "error" if backoff else "failed",
                 "error": error.splitlines()[0]}
        await engine.settle([Settlement(d.id, d.deliveries,
                                        Outcome.RETRY if backoff else Outcome.FAIL,
                                        error=error, delay=backoff or 0.0,
                                        history=[*d.history, entry])])
        await asyncio.sleep(backoff or 0)
    assert d.id == msg_id
    return msg_id


async def seed_topology(broker: Broker) -> None:
    """Channels with limits, backlogs and some served; schedules, one paused, one that
    ticked; consumer groups of topics (the channels, schedules and topics pages)."""
    engine = broker.engine
    await broker.set_channel_default("exports", rate=2)
    await broker.set_channel("tenant-acme", queue="exports", max_concurrency=2)
    await broker.set_channel("tenant-globex", queue="exports", max_concurrency=4, max_size=500)
    for tenant, n in (("tenant-acme", 40), ("tenant-globex", 25), ("tenant-initech", 60),
                      ("tenant-umbrella", 8)):
        await broker.publish_batch("exports", [{"tenant": tenant, "export": i}
                                               for i in range(n)], channel=tenant)
    for _ in range(3):  # some served, the others running
        taken = await engine.acquire(["exports"], 50, 3600)
        await engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE)
                             for d in taken[: len(taken) // 2 + 1]])
        await asyncio.sleep(0.5)
    broker.periodic("nightly-report", cron="0 3 * * *", tz="Europe/Paris", queue="reports",
                    body={"report": "daily-revenue"})
    broker.periodic("cleanup", every=timedelta(minutes=5), body="sweep", catch_up="none")
    broker.periodic("digest", every=timedelta(hours=1), body="send", catch_up="all")
    for schedule in broker.periodic_schedules:
        await engine.register_schedule(schedule)
    cleanup = broker.periodic_schedules[1]  # its last tick published, as a worker would
    tick = cleanup.cadence.latest(await engine.now())
    await engine.fire_tick("cleanup", tick, lambda: _tick(cleanup, tick))
    await broker.pause_schedule("digest")
    await broker.join_group("invoices.created", "billing")
    await broker.join_group("orders.#", "audit")
    for i in range(5):
        await broker.publish_topic("orders.created", {"order": 7000 + i})


async def _tick(schedule: Schedule, tick: datetime) -> NewMessages:
    return NewMessages.of([NewMessage(schedule.queue, b'"sweep"',
                                      schedule.message_headers(tick))])


async def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/shop.db"
        broker = Broker(url)
        dead_id = await seed(broker)
        await seed_topology(broker)
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
                await page.wait_for_selector('[data-chart="overview"] canvas')
                await page.screenshot(path=DOCS / "dashboard-overview.png", full_page=True)
                await page.goto(f"{base}/queue?name=orders")
                await page.wait_for_selector('[data-chart="latency"] canvas')
                await page.wait_for_timeout(6000)  # a second backlog sample
                await page.screenshot(path=DOCS / "dashboard-queue.png", full_page=True)
                await page.goto(f"{base}/messages/{dead_id}")
                await page.screenshot(path=DOCS / "dashboard-message.png", full_page=True)
                for name, path in (("channels", "/channels?sort=waiting"),
                                   ("schedules", "/schedules"), ("groups", "/groups")):
                    await page.goto(base + path)
                    await page.screenshot(path=DOCS / f"dashboard-{name}.png",
                                          full_page=True)
                await page.goto(f"{base}/archive?queue=orders&state=FAILED&state=CANCELLED")
                await page.locator("[data-select-matching]").check()
                await page.screenshot(path=DOCS / "dashboard-bulk.png", full_page=True)
                await browser.close()
        finally:
            server.should_exit = True
            await serving
            await worker.stop(graceful_timeout=0.1)
            await worker.close()
            await broker.close()
    for name in ("overview", "queue", "message", "bulk", "channels", "schedules", "groups"):
        print(DOCS / f"dashboard-{name}.png")
    return 0


if __name__ == "__main__":
    if not Path(CHROMIUM).exists():
        sys.exit(f"needs Chromium at {CHROMIUM}: apt-get install chromium")
    sys.exit(asyncio.run(main()))
