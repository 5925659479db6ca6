"""An ordered channel's messages reach the far broker in publish order even when sends
fail and are retried: the channel starts its next message only once the one before is
archived, which the relay does only after the far broker confirmed it. And ``sqlmq relay``
runs until SIGTERM, then stops gracefully."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

from sqlmq import Broker, Relay, Retry
from sqlmq.relay.envelope import Envelope
from sqlmq.relay.target import Target, target_for

from ..conftest import drained, wait_until
from .far import RabbitMQ, Redis

ROOT = Path(__file__).resolve().parents[2]


class Flaky:
    """A real target whose every third send fails before it is sent, and whose every fifth
    fails after RabbitMQ confirmed it (the relay cannot tell: it sends it again)."""

    def __init__(self, inner: Target) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls = 0

    async def open(self) -> None:
        await self.inner.open()

    def is_open(self) -> bool:
        return self.inner.is_open()

    async def send(self, envelope: Envelope) -> bool:
        self.calls += 1
        if self.calls % 3 == 0:
            raise ConnectionError("injected before sending")
        duplicate = await self.inner.send(envelope)
        if self.calls % 5 == 0:
            raise TimeoutError("injected after the confirmation")
        return duplicate

    async def close(self) -> None:
        await self.inner.close()


async def test_an_ordered_channel_arrives_in_publish_order_through_failed_sends(
        broker: Broker, prefix: str) -> None:
    far = RabbitMQ(f"order-{prefix.rstrip('_')}")
    await far.prepare()
    try:
        flaky = Flaky(target_for(far.url, far.options, 10.0))
        relay = Relay(broker, "outbox", to=flaky, retry=Retry.constant(0.05, max_attempts=None))
        channels: dict[str, list[int]] = {}
        for c in range(3):
            await broker.set_channel(f"order-{c}", ordered=True)
        for k in range(30):  # the channels' publishes interleaved
            for c in range(3):
                channels.setdefault(f"order-{c}", []).append(
                    await broker.publish("outbox", {"k": k}, channel=f"order-{c}"))
        await broker.start()
        await wait_until(lambda: drained(broker, "outbox"), timeout=60, message="all archived")
        arrived = [a.id for a in await far.collect(90)]
        assert relay.stats.failed >= 30  # the injected failures happened
        first = {}
        for n, msg_id in enumerate(arrived):
            first.setdefault(msg_id, n)
        for name, ids in channels.items():
            assert sorted(ids, key=first.__getitem__) == ids, name
            # a resend comes right after its first copy, never after the channel's next one
            for earlier, later in pairwise(ids):
                assert max(n for n, i in enumerate(arrived) if i == earlier) < first[later]
    finally:
        await far.remove()


async def test_sqlmq_relay_runs_until_sigterm_and_stops_gracefully(
        broker: Broker, db_url: str, prefix: str, tmp_path: Path) -> None:
    far = Redis(f"cli-{prefix.rstrip('_')}")
    await far.prepare()
    relay = subprocess.Popen(
        [sys.executable, "-m", "sqlmq.cli", "relay", "outbox", "--to", far.url,
         "--stream", far.name, "--url", db_url, "--prefix", prefix],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ids = await broker.publish_batch("outbox", [{"n": n} for n in range(100)])
        arrived = await far.collect(100, timeout=60)
        assert sorted(a.id for a in arrived) == ids
        await wait_until(lambda: drained(broker, "outbox"), message="all archived")
        relay.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(relay.communicate, timeout=60)
        assert relay.returncode == 0, err[-2000:]
        assert "received SIGTERM" in err and "worker stopped" in err, err[-2000:]
        assert "100 completed" in err, err[-2000:]
    finally:
        if relay.poll() is None:
            relay.kill()
        await far.remove()
