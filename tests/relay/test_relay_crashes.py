"""``sqlmq relay`` killed with SIGKILL six times while it relays 10,000 messages: nothing is
lost, nothing is left in sqlmq, and what arrives twice is only what was unconfirmed (sent
but not archived) at a kill. JetStream drops those duplicates by ``Nats-Msg-Id`` (every
message is in the stream once); RabbitMQ keeps them (at least once), counted and reported.

On the three databases. A run takes 20-60 s on two cores, most of it the messages
stranded by the kills, which come back when their leases expire and then run one at a time
as suspects (see sqlmq.runtime.quarantine).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from sqlmq import Broker

from ..conftest import drop_tables, one_kill_test_at_a_time, rows
from .far import Far, far_for

pytestmark = [pytest.mark.slow, one_kill_test_at_a_time]

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 10_000
KILLS = 6
#: Messages archived between two kills (at least): each kill lands in the middle of a relay.
BETWEEN_KILLS = 1_000
LEASE = 2.0  # seconds: a killed relay's messages come back soon


def start_relay(far: Far, db_url: str, prefix: str) -> subprocess.Popen[bytes]:
    option, value = next(iter(far.options.items()))
    return subprocess.Popen(
        [sys.executable, "-m", "sqlmq.cli", "relay", "outbox", "--to", far.url,
         f"--{option.replace('_', '-')}", value, "--url", db_url, "--prefix", prefix,
         "--lease", str(LEASE)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def archived(broker: Broker) -> int:
    return sum(s.completed for s in await broker.stats() if s.queue == "outbox")


async def kill_while_relaying(far: Far, broker: Broker, db_url: str,
                              prefix: str) -> set[int]:
    """Run the relay, SIGKILL it ``KILLS`` times, each once it archived ``BETWEEN_KILLS``
    more, then let one run to the end. The ids held (PROCESSING) by each killed process."""
    held: set[int] = set()
    for _ in range(KILLS):
        before = await archived(broker)
        relay = start_relay(far, db_url, prefix)
        deadline = time.monotonic() + 60
        while await archived(broker) < before + BETWEEN_KILLS:
            assert relay.poll() is None, relay.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the relay made no progress in 60 s"
            await asyncio.sleep(0.05)
        relay.send_signal(signal.SIGKILL)
        relay.wait()
        held |= {r["id"] for r in await rows(broker, "message", state="PROCESSING")}
    relay = start_relay(far, db_url, prefix)
    try:
        deadline = time.monotonic() + 120
        while await archived(broker) < MESSAGES:
            assert relay.poll() is None, relay.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"{await archived(broker)} archived in 120 s"
            await asyncio.sleep(0.1)
    finally:
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(30) == 0
    return held


#: Each database once, each far broker at least once: a kill's cost is the database's (leases,
#: suspects, archive) and the far broker's (what it confirmed); their product would add
#: three more runs of a minute or more each to the suite without a new case
PAIRS = [("jetstream", "postgresql"), ("rabbitmq", "mariadb"), ("jetstream", "sqlite")]


@pytest.mark.parametrize(("kind", "db_kind"), PAIRS)
async def test_a_relay_killed_six_times_loses_nothing_and_repeats_only_the_unconfirmed(
        kind: str, db_kind: str, db_url: str, prefix: str, tmp_path: Path) -> None:
    far = far_for(kind, f"crash-{prefix.rstrip('_')}", tmp_path)
    await far.prepare()
    broker = Broker(db_url, table_prefix=prefix)
    try:
        await broker.migrate()
        ids: list[int] = []
        for start in range(0, MESSAGES, 5_000):
            ids += await broker.publish_batch("outbox", [{"n": n} for n in range(start, start
                                                                                  + 5_000)])
        held = await kill_while_relaying(far, broker, db_url, prefix)
        assert await rows(broker, "message") == [], "messages left in sqlmq"
        assert len(await rows(broker, "archive", state="COMPLETED")) == MESSAGES
        arrived = Counter(a.id for a in await far.collect(MESSAGES, timeout=60))
        assert set(arrived) == set(ids), f"{len(set(ids) - set(arrived))} never arrived"
        twice = {i for i, n in arrived.items() if n > 1}
        if kind == "jetstream":  # its deduplication dropped every resend by Nats-Msg-Id
            assert not twice, f"{len(twice)} stored twice"
        else:
            assert twice <= held, f"{len(twice - held)} duplicates were never unconfirmed"
        print(f"\n{kind} on {db_kind}: {KILLS} kills, {len(held)} messages unconfirmed at a "
              f"kill, {sum(arrived.values()) - len(arrived)} duplicate arrivals of "
              f"{len(twice)} messages")
    finally:
        await broker.close()
        await far.remove()
        drop_tables(db_url, prefix)
