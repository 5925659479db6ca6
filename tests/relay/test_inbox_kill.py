"""``sqlmq inbox`` processes killed with SIGKILL at random moments while they take 5,000
messages from each far broker: every message ends up in sqlmq exactly once, none lost.

Between the kills a subscriber of this test handles and archives what arrived, so a
duplicate could not hide behind sqlmq's deduplication key (which holds only while its
message waits): each far message's body is counted among the live and the archived rows.
The far broker redelivers what a killed process held unacknowledged: RabbitMQ when its
connection drops, JetStream after the consumer's ack wait (1 s here), Redis when the next
process claims the dead consumer's pending entries (idle 1 s here).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from sqlmq import Broker, Message

from ..conftest import drained, one_kill_test_at_a_time, rows, wait_until
from .inbox_sources import Far, ack_wait, kill_while_taking, ledger_size

N = 5_000
KILLS = 4


async def _bodies(broker: Broker) -> Counter[bytes]:
    live = await rows(broker, "message", queue="in")
    archived = await rows(broker, "archive", queue="in")
    return Counter(r["payload"] for r in [*live, *archived])


@pytest.mark.slow
@one_kill_test_at_a_time
#: Each database once and each far broker once: what a kill tests is the far broker's
#: redelivery and the database's ledger, and the product of the two (nine runs of one to three
#: minutes) would be a third of the suite
@pytest.mark.parametrize(("source_kind", "db_kind"),
                         [("rabbitmq", "mariadb"), ("nats", "postgresql"), ("redis", "sqlite")])
async def test_killed_inbox_processes_lose_nothing_and_write_nothing_twice(
        broker: Broker, far_source: Far, db_url: str, prefix: str, tmp_path: Path) -> None:
    if far_source.kind == "nats":
        await ack_wait(far_source, "sqlmq-in", 1.0)
    bodies = [b"message %d" % i for i in range(N)]
    await far_source.publish([(f"k{i}", body, {"i": str(i)}) for i, body in enumerate(bodies)])

    @broker.subscriber("in", workers=4)
    async def handle(msg: Message) -> None:
        return None

    await broker.start()
    command = [sys.executable, "-m", "sqlmq.cli", "inbox", "in", "--from", far_source.url,
               *far_source.cli, "--url", db_url, "--prefix", prefix, "--batch", "200"]
    try:
        await kill_while_taking(command, broker, N, KILLS, (200, 900), tmp_path / "inbox.log")
        await wait_until(lambda: drained(broker, "in"), timeout=60, message="sqlmq drained")
    finally:
        await broker.stop()
    got = await _bodies(broker)
    twice = {b: n for b, n in got.items() if n > 1}
    assert not twice, f"{len(twice)} far messages twice in sqlmq, e.g. {list(twice)[:3]}"
    assert sorted(got) == sorted(bodies), f"{N - len(got)} far messages lost"
    assert await ledger_size(broker) == N
