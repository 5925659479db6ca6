"""The channels, schedules and topics pages in a real headless Chromium, against ``sqlmq
dashboard`` serving in a process of its own, beside a worker in another process: the
channels page shows a seeded channel's counts; a limit changed on a channel's page is
obeyed by the worker from then on; a schedule paused on the schedules page publishes no
tick from the worker that runs it; the topics page lists a group. One browser, no console
error; on PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sqlmq import Broker

from .conftest import rows, wait_until
from .procs import BEAT, handled_ids, ready_marker, spawn_worker, terminate, worker_log
from .test_dashboard import CHROMIUM, _serve, _stop, browser

#: How long the worker's handler takes, so that the running deliveries can be counted.
HANDLER = 0.4


async def _most_running(broker: Broker, channel: str, done: Path, total: int) -> int:
    """Sample ``channel``'s running count until the worker recorded ``total`` ids in
    ``done``; the most seen at once."""
    most = 0

    async def drained() -> bool:
        nonlocal most
        found = next(c for c in await broker.channels() if c.name == channel)
        most = max(most, found.running)
        return len(handled_ids(done)) >= total

    await wait_until(drained, timeout=30, interval=0.03, message=f"{total} handled")
    return most


@browser
@pytest.mark.parametrize("db_kind", ["postgresql", "sqlite"])
async def test_in_a_real_browser_limits_and_pauses_reach_a_worker_in_another_process(
        broker: Broker, db_url: str, prefix: str, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright, expect

    await broker.set_channel("tenant-1", queue="jobs", max_concurrency=3)
    await broker.publish_batch("idle", [1, 2], channel="seen")  # no worker takes these
    await broker.join_group("orders.*", "billing")
    out = tmp_path / "worker.ids"
    worker = spawn_worker(db_url, prefix, "jobs", out, sleep=HANDLER, every=0.2,
                          catch_up="none")
    proc, port = await _serve("--url", db_url, "--prefix", prefix, "--refresh", "1")
    base = f"http://127.0.0.1:{port}"
    problems: list[str] = []
    try:
        await wait_until(lambda: ready_marker(out).exists(), timeout=60,
                         message="the worker process running")
        await broker.publish_batch("jobs", list(range(6)), channel="tenant-1")
        assert await _most_running(broker, "tenant-1", out, 6) > 1  # the limit before: 3
        async with async_playwright() as p:
            chromium = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = await chromium.new_page()
                page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                page.on("console", lambda m: problems.append(
                    f"console: {m.text} {m.location}") if m.type == "error" else None)
                page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))

                await page.goto(f"{base}/channels")
                seen = page.locator('tr[data-channel="seen"]')
                assert await seen.locator('[data-col="waiting"]').inner_text() == "2"
                assert await seen.locator('[data-col="running"]').inner_text() == "0"

                await page.goto(f"{base}/channel?name=tenant-1")
                await page.fill('#channel-limits input[name="max_concurrency"]', "1")
                await page.click('#channel-limits button[type="submit"]')
                await expect(page.locator(".notice")).to_contain_text(
                    "Channel 'tenant-1': max concurrency 1.", timeout=20_000)
                await broker.publish_batch("jobs", [6, 7, 8], channel="tenant-1")
                assert await _most_running(broker, "tenant-1", out, 9) == 1  # obeyed

                await page.goto(f"{base}/schedules")
                row = page.locator(f'tr[data-schedule="{BEAT}"]')
                await row.locator("button", has_text="Pause").click()
                await expect(page.locator(".notice")).to_contain_text(
                    f"Paused schedule '{BEAT}'.", timeout=20_000)
                await expect(row.locator(".badge.paused")).to_have_count(1)
                ticked = len(await rows(broker, queue=BEAT))
                assert ticked > 0  # it ticked before
                await asyncio.sleep(0.7)  # three ticks of its cadence and more
                assert len(await rows(broker, queue=BEAT)) == ticked

                await page.goto(f"{base}/groups")
                group = page.locator('tr[data-group="billing"]')
                await expect(group).to_contain_text("billing@orders.*")
            finally:
                await chromium.close()
    finally:
        await _stop(proc)
        code = terminate(worker)
    assert code == 0, worker_log(out)
    assert problems == []
