"""Database restart: the server goes away mid-run and comes back; the workers resume by
themselves and nothing is lost or archived twice.

Runs on a private PostgreSQL / MariaDB (see :mod:`.servers`), never on the shared ones. The
time until throughput recovers is printed (and appended as JSON to ``$SQLMQ_FAULT_FIGURES``
when set, for ``bench/faults_report.py``); it is a figure, not a pass/fail threshold.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqlmq import Broker, Message

from ..conftest import rows, wait_until
from .servers import PrivateMariaDB, PrivatePostgres, ServerError

MESSAGES = int(os.environ.get("SQLMQ_RESTART_MESSAGES", "3000"))
DOWN = float(os.environ.get("SQLMQ_RESTART_DOWN", "1.0"))  # seconds the server stays down


def incident_lines(caplog: pytest.LogCaptureFixture, marker: str) -> list[str]:
    """The lines a loop's :class:`sqlmq.backoff.FailureRun` wrote: an incident's start
    (`` failed (``) or its end (`` recovered after ``)."""
    return [r.getMessage() for r in caplog.records
            if r.module == "backoff" and marker in r.getMessage()]


@pytest.fixture(params=["postgresql", "mariadb"])
def private_server(request: pytest.FixtureRequest) -> Iterator[PrivatePostgres | PrivateMariaDB]:
    base = Path(tempfile.mkdtemp(prefix="sqlmq-restart-"))
    base.chmod(0o755)  # the postgres OS user must reach its data directory
    server = PrivatePostgres(base) if request.param == "postgresql" else PrivateMariaDB(base)
    try:
        server.create()
    except ServerError as exc:
        server.destroy()
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(f"the restart test needs a private {request.param} server it may restart "
                    f"(the shared one must not be), and none could be started: {exc}")
    try:
        yield server
    finally:
        server.destroy()
        shutil.rmtree(base, ignore_errors=True)


class Throughput:
    """Samples the completed counter, to tell when the rate is back after the restart."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.samples: list[tuple[float, int]] = []

    def completed(self) -> int:
        return sum(r.counters.completed for r in self.broker.runtimes)

    async def run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), self.completed()))
            await asyncio.sleep(0.02)

    def rate(self, start: float, end: float) -> float:
        window = [(t, n) for t, n in self.samples if start <= t <= end]
        if len(window) < 2:
            return 0.0
        return (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])

    def recovered_at(self, after: float, target: float, window: float = 0.5) -> float | None:
        """The first moment after ``after`` from which a ``window`` runs at ``target``."""
        for t, _ in self.samples:
            if t >= after and self.rate(t, t + window) >= target:
                return t
        return None


@pytest.mark.slow
async def test_workers_resume_by_themselves_after_the_database_restarts(
    private_server: PrivatePostgres | PrivateMariaDB, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sqlmq")
    server = private_server
    broker = Broker(server.url, table_prefix="restart_", recovery_interval=0.5)
    await broker.migrate()

    @broker.subscriber("jobs", workers=8, fetch_batch=20, lease=10.0, flush_interval=0.05,
                       max_fetch_interval=0.2)
    async def handle(msg: Message) -> None:
        await asyncio.sleep(0.01)

    published = await broker.publish_batch("jobs", ({"n": i} for i in range(MESSAGES)))
    meter = Throughput(broker)
    await broker.start()
    sampling = asyncio.create_task(meter.run())
    try:
        await wait_until(lambda: meter.completed() >= MESSAGES // 4, timeout=120,
                         message="a quarter of the messages handled before the restart")
        stopping = time.monotonic()
        before = meter.rate(stopping - 1.0, stopping)
        await asyncio.to_thread(server.stop)
        down = time.monotonic()
        await asyncio.sleep(DOWN)  # clients see refused connections meanwhile
        await asyncio.to_thread(server.start)
        up = time.monotonic()
        await wait_until(lambda: meter.completed() >= MESSAGES, timeout=180,
                         message="every message handled after the restart")
        await broker.stop()
    finally:
        sampling.cancel()
        await broker.close()

    survivor = Broker(server.url, table_prefix="restart_")
    try:
        archived = await rows(survivor, "archive")
        left = await rows(survivor, "message")
    finally:
        await survivor.close()

    back = meter.recovered_at(up, 0.5 * before)
    figures = {
        "database": server.kind, "messages": MESSAGES,
        "rate_before_per_s": round(before, 1),
        "stop_seconds": round(down - stopping, 2), "down_seconds": round(up - down, 2),
        "throughput_back_after_up_s": None if back is None else round(back - up, 2),
        "failure_logs": len(incident_lines(caplog, " failed (")),
        "recovery_logs": len(incident_lines(caplog, " recovered after ")),
    }
    print(f"\nrestart figures: {figures}")
    if os.environ.get("SQLMQ_FAULT_FIGURES"):
        with open(os.environ["SQLMQ_FAULT_FIGURES"], "a") as out:
            out.write(json.dumps({"test": "restart", **figures}) + "\n")

    assert left == []
    assert sorted(r["id"] for r in archived) == sorted(published)  # none lost, none twice
    assert {r["state"] for r in archived} == {"COMPLETED"}
    # The outage was noticed, and each loop's incident was logged once and closed once
    # (whatever the loop does next: back off, or look again at its interval).
    failures = incident_lines(caplog, " failed (")
    recoveries = incident_lines(caplog, " recovered after ")
    assert failures
    loops = {m.split(" failed (")[0] for m in failures}
    assert len(failures) == len(loops)
    assert {m.split(" recovered after")[0] for m in recoveries} == loops
