"""The far brokers the relay tests send to, as a test sees them: the real RabbitMQ, NATS
JetStream, Redis and Mosquitto servers of the development and CI machines. Each :class:`Far`
makes a destination of its own for one test (a queue, a stream, a topic named after the
test's table prefix, so tests run in parallel), reads back what arrived there, and removes it.

A server that is down fails the test naming it: these tests claim the relay's behaviour
against the real thing, and a skip would hide that they did not run.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HOST = "127.0.0.1"
#: Each far broker: its name, port and the URL a relay is given.
SERVERS = {
    "rabbitmq": ("RabbitMQ", 5672, f"amqp://guest:guest@{HOST}:5672/"),
    "jetstream": ("NATS with JetStream", 4222, f"nats://{HOST}:4222"),
    "redis": ("Redis", 6379, f"redis://{HOST}:6379/0"),
    "mqtt": ("Mosquitto (MQTT 5)", 1883, f"mqtt://{HOST}:1883"),
}
KINDS = list(SERVERS)
#: seconds; JetStream deduplicates by Nats-Msg-Id within it
DUPLICATE_WINDOW = 900.0


def require(kind: str) -> str:
    """The server's URL, or fail the test naming the server that is down."""
    name, port, url = SERVERS[kind]
    try:
        socket.create_connection((HOST, port), timeout=3).close()
    except OSError as exc:
        pytest.fail(f"{name} is not running on {HOST}:{port} ({exc}): the relay tests need "
                    "it (it runs on every development and CI machine)", pytrace=False)
    return url


@dataclass
class Arrived:
    """One message as it arrived on the far side."""

    id: int  # its sqlmq-id field
    payload: bytes
    published_at: str
    native_id: str | None = None  # the far broker's own id field (message_id, Nats-Msg-Id)


class Far:
    """One test's destination on one far broker."""

    kind: str

    def __init__(self, name: str) -> None:
        self.name = name  # unique to the test
        self.url = require(self.kind)

    #: The Relay's keyword arguments that send to this destination.
    options: dict[str, str]

    async def prepare(self) -> None: ...

    async def collect(self, count: int, timeout: float = 60.0) -> list[Arrived]:
        """Everything that arrived, in arrival order, once at least ``count`` did (or the
        timeout passed: the test's assertions then say what is missing)."""
        raise NotImplementedError

    async def remove(self) -> None: ...


class RabbitMQ(Far):
    kind = "rabbitmq"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.options = {"routing_key": name}

    async def prepare(self) -> None:
        import aio_pika

        self.connection = await aio_pika.connect(self.url)
        self.channel = await self.connection.channel()
        await self.channel.set_qos(prefetch_count=1000)
        # durable: it outlives `rabbitmqctl stop_app` with its persistent messages
        self.queue = await self.channel.declare_queue(self.name, durable=True)
        self.arrived: list[Arrived] = []

        async def take(message: Any) -> None:
            self.arrived.append(Arrived(int(message.headers["sqlmq-id"]), message.body,
                                        str(message.headers["sqlmq-published-at"]),
                                        message.message_id))

        await self.queue.consume(take, no_ack=True)

    async def collect(self, count: int, timeout: float = 60.0) -> list[Arrived]:
        await _until(lambda: len(self.arrived) >= count, timeout)
        await asyncio.sleep(0.2)  # anything more (a duplicate) on its way
        return list(self.arrived)

    async def remove(self) -> None:
        try:
            await self.queue.delete(if_unused=False, if_empty=False)
        finally:
            await self.connection.close()


class JetStream(Far):
    kind = "jetstream"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.stream = name.upper().replace("-", "_")
        self.options = {"subject": f"{name}.out"}

    async def prepare(self) -> None:
        import nats

        self.nc = await nats.connect(self.url)
        self.js = self.nc.jetstream()
        # A duplicate window longer than any test (the default's two minutes is not, on a
        # loaded machine): a resend after the window is stored again, as docs/relay.md warns
        await self.js.add_stream(name=self.stream, subjects=[f"{self.name}.>"],
                                 duplicate_window=DUPLICATE_WINDOW)

    async def collect(self, count: int, timeout: float = 60.0) -> list[Arrived]:
        async def stored() -> bool:
            return (await self.js.stream_info(self.stream)).state.messages >= count

        await _until(stored, timeout)
        import nats.errors

        sub = await self.js.pull_subscribe(f"{self.name}.>", stream=self.stream)
        total = (await self.js.stream_info(self.stream)).state.messages
        # Each stored message once, keyed by its stream sequence, and in sequence order at
        # the end. The consumer delivers again what it fetched but saw unacknowledged for
        # its ack wait (30 s), and a fetch can come back empty while the rest of the stream
        # sits delivered to an earlier, expired pull request until that wait runs out (a CI
        # run saw a 10 s fetch time out so): an empty fetch is not the end; the deadline is.
        by_sequence: dict[int, Arrived] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(by_sequence) < total and loop.time() < deadline:
            try:
                got = await sub.fetch(batch=min(1000, total - len(by_sequence)), timeout=10)
            except nats.errors.TimeoutError:
                continue
            for m in got:
                h = m.headers or {}
                by_sequence.setdefault(m.metadata.sequence.stream, Arrived(
                    int(h["sqlmq-id"]), m.data, h["sqlmq-published-at"], h.get("Nats-Msg-Id")))
                await m.ack()
        arrived = [by_sequence[n] for n in sorted(by_sequence)]
        await sub.unsubscribe()
        return arrived

    async def remove(self) -> None:
        try:
            await self.js.delete_stream(self.stream)
        finally:
            await self.nc.close()


class Redis(Far):
    kind = "redis"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.options = {"stream": name}

    async def prepare(self) -> None:
        import redis.asyncio

        self.redis = redis.asyncio.Redis(host=HOST)

    async def collect(self, count: int, timeout: float = 60.0) -> list[Arrived]:
        async def stored() -> bool:
            return int(await self.redis.xlen(self.name)) >= count

        await _until(stored, timeout)
        arrived: list[Arrived] = []
        start = "-"
        while True:
            entries = await self.redis.xrange(self.name, min=start, count=5000)
            for _, f in entries:
                arrived.append(Arrived(int(f[b"sqlmq-id"]), f[b"body"],
                                       f[b"sqlmq-published-at"].decode()))
                assert json.loads(f[b"headers"])["content-type"]
            if len(entries) < 5000:
                return arrived
            start = "(" + entries[-1][0].decode()

    async def remove(self) -> None:
        try:
            await self.redis.delete(self.name)
        finally:
            await self.redis.aclose()


class MQTT(Far):
    """Read by a subscriber of its own process (``mqtt_listener.py``, paho's network
    thread): Mosquitto drops QoS 1 messages beyond 1,000 queued for a subscriber that does
    not keep up, and one sharing the relay's event loop did not."""

    kind = "mqtt"

    def __init__(self, name: str, tmp: Path) -> None:
        super().__init__(name)
        self.topic = f"sqlmq-test/{name}"
        self.options = {"topic": self.topic}
        self.out = tmp / f"{name}.mqtt"

    async def prepare(self) -> None:
        self.listener = subprocess.Popen(
            [sys.executable, "-m", "tests.relay.mqtt_listener", self.topic, str(self.out)],
            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.listener.stdout is not None
        line = await asyncio.to_thread(self.listener.stdout.readline)
        assert line.strip() == "subscribed", line

    def _read(self) -> list[Arrived]:
        if not self.out.exists():
            return []
        arrived = []
        for line in self.out.read_text().splitlines():
            if line.count("\t") == 2:
                msg_id, published_at, payload = line.split("\t")
                arrived.append(Arrived(int(msg_id), bytes.fromhex(payload), published_at))
        return arrived

    async def collect(self, count: int, timeout: float = 60.0) -> list[Arrived]:
        await _until(lambda: len(self._read()) >= count, timeout)
        await asyncio.sleep(0.2)
        return self._read()

    async def remove(self) -> None:
        self.listener.terminate()
        self.listener.wait(10)


def far_for(kind: str, name: str, tmp: Path) -> Far:
    if kind == "mqtt":
        return MQTT(name, tmp)
    return {"rabbitmq": RabbitMQ, "jetstream": JetStream, "redis": Redis}[kind](name)


async def _until(predicate: Any, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        done = predicate()
        if asyncio.iscoroutine(done):
            done = await done
        if done:
            return
        await asyncio.sleep(0.05)
