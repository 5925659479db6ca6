"""The far brokers the inbox tests take from (fixtures ``source_kind`` and ``far_source``,
registered by ``tests/relay/conftest.py``): RabbitMQ, NATS JetStream and Redis, the real
servers that run on the development machines and on CI (127.0.0.1, their standard ports;
``SQLMQ_TEST_AMQP_URL``, ``SQLMQ_TEST_NATS_URL``, ``SQLMQ_TEST_REDIS_URL`` override them).

A test that finds one down fails, naming it: it is never skipped. Each test gets a queue or
stream of its own (a random name), deleted afterwards.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

AMQP_URL = os.environ.get("SQLMQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("SQLMQ_TEST_NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("SQLMQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

KINDS = ["rabbitmq", "nats", "redis"]

#: One far message a test publishes: its key (None: the far broker's own id), body, headers.
Item = tuple[str | None, bytes, dict[str, str]]


def down(what: str, url: str, exc: BaseException) -> None:
    pytest.fail(f"{what} is not reachable at {url} ({type(exc).__name__}: {exc}): the inbox "
                "tests need it running (it does on the development machines and on CI)",
                pytrace=False)


@dataclass
class Far:
    """A queue (RabbitMQ) or stream (JetStream, Redis) of this test on a far broker."""

    kind: str
    url: str
    name: str
    #: What :class:`~sqlmq.Inbox` is given to read it, and the same as CLI options.
    options: dict[str, Any]
    cli: list[str]
    client: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    async def publish(self, items: Sequence[Item]) -> list[str]:
        """Publish ``items`` in order; the keys the inbox will read for them."""
        return await getattr(self, f"_publish_{self.kind}")(items)

    async def _publish_rabbitmq(self, items: Sequence[Item]) -> list[str]:
        import aio_pika

        channel = self.extra["channel"]
        for key, body, headers in items:
            await channel.default_exchange.publish(
                aio_pika.Message(body, message_id=key, headers=dict(headers)),
                routing_key=self.name)
        return [k or "" for k, _, _ in items]

    async def _publish_nats(self, items: Sequence[Item]) -> list[str]:
        nc = self.client
        js = nc.jetstream()
        before = (await js.stream_info(self.name)).state.last_seq
        for key, body, headers in items:  # core publishes, stored by the stream: no round trip
            h = dict(headers)
            if key is not None:
                h["Nats-Msg-Id"] = key
            await nc.publish(f"{self.name}.in", body, headers=h or None)
        await nc.flush()
        keys = []
        for n, (key, _, _) in enumerate(items):
            keys.append(key if key is not None else str(before + n + 1))
        for _ in range(500):  # the stream has them all
            if (await js.stream_info(self.name)).state.last_seq >= before + len(items):
                break
            await asyncio.sleep(0.02)
        return keys

    async def _publish_redis(self, items: Sequence[Item]) -> list[str]:
        keys: list[str] = []
        for start in range(0, len(items), 1000):
            pipe = self.client.pipeline(transaction=False)
            for key, body, headers in items[start : start + 1000]:
                fields = {"body": body, **headers}
                if key is not None:
                    fields["key"] = key
                pipe.xadd(self.name, fields)
            keys += [i.decode() for i in await pipe.execute()]
        return keys  # the entry ids (a given key is in the field "key", for key_header=)


async def _rabbitmq(name: str) -> AsyncIterator[Far]:
    import aio_pika

    try:
        connection = await aio_pika.connect(AMQP_URL, timeout=10)
    except Exception as exc:
        down("RabbitMQ", AMQP_URL, exc)
    channel = await connection.channel()
    queue = await channel.declare_queue(name, durable=False, auto_delete=False)
    try:
        yield Far("rabbitmq", AMQP_URL, name, {"queue_name": name}, ["--queue-name", name],
                  connection, {"channel": channel})
    finally:
        await queue.delete(if_unused=False, if_empty=False)
        await connection.close()


async def _nats(name: str) -> AsyncIterator[Far]:
    import nats

    try:
        nc = await nats.connect(NATS_URL, connect_timeout=5, max_reconnect_attempts=1,
                                reconnect_time_wait=0.2)
    except Exception as exc:
        down("NATS", NATS_URL, exc)
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    try:
        yield Far("nats", NATS_URL, name, {"stream": name}, ["--stream", name], nc)
    finally:
        await js.delete_stream(name)
        await nc.close()


async def _redis(name: str) -> AsyncIterator[Far]:
    from redis.asyncio import from_url

    client = from_url(REDIS_URL, socket_connect_timeout=5)
    try:
        await client.ping()
    except Exception as exc:
        await client.aclose()
        down("Redis", REDIS_URL, exc)
    try:
        yield Far("redis", REDIS_URL, name, {"stream": name, "claim_idle": 1.0},
                  ["--stream", name, "--claim-idle", "1s"], client)
    finally:
        await client.delete(name)
        await client.aclose()


OPENERS = {"rabbitmq": _rabbitmq, "nats": _nats, "redis": _redis}


@pytest.fixture(params=KINDS)
def source_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def far_source(source_kind: str) -> AsyncIterator[Far]:
    """A fresh queue or stream on the far broker ``source_kind``, deleted afterwards."""
    name = f"sqlmq-inbox-{uuid.uuid4().hex[:12]}"
    async for made in OPENERS[source_kind](name):
        yield made


async def ack_wait(far: Far, durable: str, seconds: float) -> None:
    """JetStream: make the inbox's durable consumer beforehand, redelivering what was not
    acknowledged after ``seconds`` (the inbox binds to a consumer that exists)."""
    from nats.js.api import AckPolicy, ConsumerConfig

    await far.client.jetstream().add_consumer(far.name, ConsumerConfig(
        durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=seconds,
        max_ack_pending=20_000))


async def ledger_size(broker: Any) -> int:
    """Rows in the inbox's ledger: far messages taken so far, whoever took them."""
    from sqlalchemy import func, select

    async with broker.db.connect() as conn:
        return (await conn.execute(
            select(func.count()).select_from(broker.schema.inbox_seen))).scalar_one()


#: What an inbox process logs once it runs, its signal handlers in place
#: (:meth:`sqlmq.relay.inbox.Inbox.run` logs it; ``sqlmq inbox`` set them before).
STARTED = " started (ledger source "


async def kill_while_taking(command: list[str], broker: Any, n: int, kills: int,
                            step: tuple[int, int], log_path: Any,
                            started: str = STARTED) -> None:
    """Run ``command`` (a process taking far messages into ``broker``'s database) and
    SIGKILL it ``kills`` times, each once the ledger has grown by a random count within
    ``step``; then run it until the ledger holds ``n`` keys and stop it with SIGTERM, once
    it logged ``started`` (its signal handlers in place)."""
    import os
    import random
    import signal
    import subprocess

    from ..conftest import wait_until

    rng = random.Random(n)
    with open(log_path, "ab") as log:
        for _ in range(kills):
            proc = subprocess.Popen(command, stdout=log, stderr=log)
            target = min(await ledger_size(broker) + rng.randint(*step), n)

            async def progressed(proc: subprocess.Popen[bytes] = proc,
                                 target: int = target) -> bool:
                return proc.poll() is not None or await ledger_size(broker) >= target

            await wait_until(progressed, timeout=60, message="the process's progress")
            assert proc.poll() is None, open(log_path).read()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        proc = subprocess.Popen(command, stdout=log, stderr=log)

        async def all_taken() -> bool:
            return await ledger_size(broker) >= n

        def running() -> bool:  # its signal handlers are in place once it says so
            return proc.poll() is not None or open(log_path).read().count(started) > kills

        await wait_until(all_taken, timeout=120, message=f"{n} messages in the ledger")
        # The last killed process may have taken the last messages: this one is then still
        # starting, and a SIGTERM before its handlers exist ended it with -15.
        await wait_until(running, timeout=60, message="the last process started")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, open(log_path).read()

