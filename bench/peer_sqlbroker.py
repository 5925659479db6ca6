"""faststream-sqlbroker (the seed system) for bench/relay.py and bench/inbox.py, run by the
Python of bench/.venv-sqlbroker (``bash bench/setup.sh``): never imports sqlmq.

Its relay is the one its documentation shows: a SqlBroker subscriber decorated with a
FastStream publisher of the far broker, here RabbitMQ (publisher confirms, which FastStream
channels have by default, and ``persist=True``, as sqlmq's relay sends) or NATS JetStream
(the publisher given the stream, so each publish awaits its PubAck). Its subscriber options
have no defaults; these are tuned for throughput: ``fetch_batch_size=1000,
max_fetch_interval=0.1, min_fetch_interval=0, flush_interval=0.05``.

faststream-sqlbroker has no inbox; the ``inbox`` role is the hand-written one its users
would write: a FastStream subscriber of the far broker whose handler publishes each message
into SqlBroker (a transaction per message, acknowledged after it; no deduplication).

Roles (one JSON line on stdout each; tables named with ``BENCH_PEER_PREFIX``, dropped after):
  relay TARGET NAME N WORKERS     preload N, time the relay until its table is empty
  serve TARGET NAME EXPECTED      run the relay until EXPECTED messages were forwarded
  publish TARGET NAME RATE SECS   a transaction per message at RATE (the latency run's)
  inbox TARGET NAME N             time the hand-written inbox until N messages are in SqlBroker
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sys
import time
from typing import Any

from faststream import Response
from faststream_sqlbroker import SqlBroker, SqlBrokerMessage, SqlBrokerSchemaConfig
from faststream_sqlbroker.sqlbroker.schema import define_sqlbroker_schema
from pacing import STAMP, paced  # bench/pacing.py: this script runs from bench/
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

DSN = os.environ.get("BENCH_PG_DSN", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
PREFIX = os.environ.get("BENCH_PEER_PREFIX", f"benchfsb{os.getpid()}_")
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("BENCH_NATS_URL", "nats://127.0.0.1:4222")
PAYLOAD = b"x" * 64
QUEUE = "relay"
#: The relay's subscriber options (none has a default in faststream-sqlbroker).
RELAY_OPTIONS = {"fetch_batch_size": 1000, "max_fetch_interval": 0.1,
                 "min_fetch_interval": 0.0, "flush_interval": 0.05}


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stream_of(name: str) -> str:
    return name.upper().replace("-", "_")


def far_broker(target: str) -> Any:
    if target == "amqp":
        from faststream.rabbit import RabbitBroker

        return RabbitBroker(AMQP_URL, logger=None)
    from faststream.nats import NatsBroker

    return NatsBroker(NATS_URL, logger=None)


def far_publisher(far: Any, target: str, name: str) -> Any:
    if target == "amqp":
        return far.publisher(name, persist=True)  # confirms: FastStream's channel default
    return far.publisher(f"{name}.out", stream=stream_of(name))


class Tables:
    """faststream-sqlbroker's two tables under this run's prefix."""

    def __init__(self) -> None:
        self.engine = create_async_engine(DSN, pool_size=10)
        self.schema = SqlBrokerSchemaConfig(message_table_name=f"{PREFIX}message",
                                            message_archive_table_name=f"{PREFIX}archive")
        self.tables = define_sqlbroker_schema(config=self.schema).tables
        self.message = next(iter(self.tables.values()))
        self.metadata = self.message.metadata

    async def create(self) -> None:
        async with self.engine.begin() as conn:
            await conn.run_sync(self.metadata.drop_all)
            await conn.run_sync(self.metadata.create_all)

    async def drop(self) -> None:
        async with self.engine.begin() as conn:
            await conn.run_sync(self.metadata.drop_all)
        await self.engine.dispose()

    async def count(self, table: Any = None) -> int:
        async with self.engine.connect() as conn:
            return int(await conn.scalar(select(func.count()).select_from(
                self.message if table is None else table)) or 0)

    def broker(self) -> SqlBroker:
        return SqlBroker(engine=self.engine, schema=self.schema, logger=None)


def relay_broker(tables: Tables, target: str, name: str, workers: int) -> tuple[SqlBroker, Any,
                                                                                list[int]]:
    """A SqlBroker whose subscriber relays ``QUEUE`` to ``target`` as faststream-sqlbroker's
    documentation shows; the far broker; a one-element list counting forwarded messages."""
    broker = tables.broker()
    far = far_broker(target)
    forwarded = [0]

    @far_publisher(far, target, name)
    @broker.subscriber([QUEUE], max_workers=workers, **RELAY_OPTIONS)
    async def forward(body: bytes, msg: SqlBrokerMessage) -> Response:
        forwarded[0] += 1
        return Response(body, headers={"x-sqlbroker-id": str(msg.message_id)})

    return broker, far, forwarded


async def relay(target: str, name: str, n: int, workers: int) -> None:
    tables = Tables()
    await tables.create()
    try:
        broker, far, _ = relay_broker(tables, target, name, workers)
        await broker.connect()
        for start in range(0, n, 2000):  # 8 parameters a row; asyncpg takes 32,767
            await broker.publish_batch(*[PAYLOAD] * min(2000, n - start), queue=QUEUE)
        await far.start()
        cpu, started = cpu_seconds(), time.perf_counter()
        await broker.start()
        try:
            while await tables.count():
                await asyncio.sleep(0.05)
            seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        finally:
            await broker.stop()
            await far.stop()
    finally:
        await tables.drop()
    emit(seconds=seconds, cpu=cpu)


async def serve(target: str, name: str, expected: int) -> None:
    tables = Tables()
    await tables.create()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        broker, far, forwarded = relay_broker(tables, target, name, 256)
        await far.start()
        await broker.start()
        emit(ready=True)
        deadline = time.monotonic() + 600
        while forwarded[0] < expected and not stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await broker.stop()
        await far.stop()
    finally:
        await tables.drop()


async def publish(rate: float, seconds: float) -> None:
    broker = Tables().broker()
    await broker.connect()
    committed: dict[str, float] = {}

    async def send(payload: bytes) -> None:
        await broker.publish(payload, queue=QUEUE)
        committed[payload[:STAMP].decode()] = time.time()

    await asyncio.gather(*(broker.publish(b"", queue=QUEUE + "-warmup") for _ in range(8)))
    achieved = await paced(rate, seconds, send)
    await broker.stop()
    emit(rate=achieved, committed=committed)


async def inbox(target: str, name: str, n: int) -> None:
    """The hand-written inbox: a FastStream subscriber of the far queue or stream (filled
    by the caller) that publishes each message into SqlBroker, acknowledged after."""
    tables = Tables()
    await tables.create()
    try:
        broker = tables.broker()
        far = far_broker(target)
        if target == "amqp":
            from faststream.rabbit import Channel, RabbitQueue

            subscriber = far.subscriber(RabbitQueue(name, durable=True, declare=False),
                                        channel=Channel(prefetch_count=1000))
        else:
            from faststream.nats import JStream, PullSub

            subscriber = far.subscriber(f"{name}.in", stream=JStream(stream_of(name),
                                                                     declare=False),
                                        durable=f"fsb-{os.getpid()}",
                                        pull_sub=PullSub(batch_size=500))

        @subscriber
        async def take(body: bytes) -> None:
            await broker.publish(body, queue="inbox")

        await broker.connect()
        cpu, started = cpu_seconds(), time.perf_counter()
        await far.start()
        try:
            while await tables.count() < n:
                await asyncio.sleep(0.05)
            seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        finally:
            await far.stop()
            await broker.stop()
    finally:
        await tables.drop()
    emit(seconds=seconds, cpu=cpu)


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    if role == "relay":
        asyncio.run(relay(rest[0], rest[1], int(rest[2]), int(rest[3])))
    elif role == "serve":
        asyncio.run(serve(rest[0], rest[1], int(rest[2])))
    elif role == "publish":
        asyncio.run(publish(float(rest[2]), float(rest[3])))
    elif role == "inbox":
        asyncio.run(inbox(rest[0], rest[1], int(rest[2])))
    else:
        raise SystemExit(f"unknown role {role!r}")
