"""RabbitMQ stopped (``rabbitmqctl stop_app``) in the middle of a relay: the messages wait
in the database, none is lost or dead-lettered, the relay connects again by itself once
RabbitMQ is back, and its log says so in two lines, not one per message.

On PostgreSQL only: the outage is the far broker's, and what the database does about it
(a nack, a retry after the strategy's delay) is the same on every database and covered by
the other relay tests on all three."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from sqlmq import Broker, Relay

from ..conftest import PG_URL, drop_tables, rows, wait_until
from .far import require

pytestmark = [pytest.mark.slow, pytest.mark.alone]

RABBITMQCTL = "/usr/sbin/rabbitmqctl"


def rabbitmqctl(command: str) -> None:
    subprocess.run([RABBITMQCTL, command], check=True, capture_output=True, timeout=120)


async def read_queue(url: str, name: str, count: int) -> list[int]:
    """The sqlmq ids of the messages in queue ``name`` (deleted after), once ``count`` are."""
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, durable=True)
        ids: list[int] = []

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            ids.append(int(message.headers["sqlmq-id"]))  # type: ignore[arg-type]

        await queue.consume(take, no_ack=True)
        await wait_until(lambda: len(ids) >= count, timeout=30,
                         message=f"{count} messages in RabbitMQ's queue {name}")
        await queue.delete(if_unused=False, if_empty=False)
        return ids
    finally:
        await connection.close()


async def declare(url: str, name: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        await (await connection.channel()).declare_queue(name, durable=True)
    finally:
        await connection.close()


async def test_rabbitmq_stopped_mid_relay_makes_messages_wait_and_the_relay_resumes_alone(
        prefix: str, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    url = require("rabbitmq")
    name = f"outage-{prefix.rstrip('_')}"
    await declare(url, name)  # durable, with persistent messages: they outlive stop_app
    broker = Broker(PG_URL, table_prefix=prefix)
    caplog.set_level(logging.INFO, logger="sqlmq")
    stopped = False
    try:
        await broker.migrate()
        relay = Relay(broker, "outbox", to=url, routing_key=name)
        before = await broker.publish_batch("outbox", [{"n": n} for n in range(200)])
        await broker.start()
        await wait_until(lambda: _archived(broker, 200), timeout=30,
                         message="the first 200 relayed")
        rabbitmqctl("stop_app")
        stopped = True
        during = await broker.publish_batch("outbox", [{"n": n} for n in range(200, 500)])
        await wait_until(lambda: relay.stats.failed >= 300, timeout=30,
                         message="every message of the outage tried once")
        assert len(await rows(broker, "archive")) == 200, "archived while RabbitMQ was down"
        assert len(await rows(broker, "message")) == 300
        rabbitmqctl("start_app")
        stopped = False
        await wait_until(lambda: _archived(broker, 500), timeout=60,
                         message="the relay resumed by itself")
        assert {r["state"] for r in await rows(broker, "archive")} == {"COMPLETED"}
        arrived = await read_queue(url, name, 500)
        assert set(arrived) == set(before + during)
    finally:
        if stopped:
            rabbitmqctl("start_app")
        await broker.close()
        drop_tables(PG_URL, prefix)
    down = [r for r in caplog.records if "sending failed" in r.getMessage()]
    back = [r for r in caplog.records if "sending again" in r.getMessage()]
    per_message = [r for r in caplog.records if "failed on message" in r.getMessage()]
    assert (len(down), len(back), per_message) == (1, 1, []), [r.getMessage() for r in down]
    assert "RabbitMQ at amqp://guest:***@127.0.0.1:5672/" in down[0].getMessage()
    # aiormq says once that the connection it had was closed (two lines); the connection
    # attempts that fail after it are the relay's to report, and are not repeated
    others = [f"{r.name}: {r.getMessage()}"[:200] for r in caplog.records
              if r.levelno >= logging.WARNING and r not in (*down, *back)
              and not r.getMessage().startswith("Consumer")]  # read_queue's, at the end
    assert len(others) <= 2 and all(o.startswith("aiormq.connection") for o in others), others


async def _archived(broker: Broker, count: int) -> bool:
    return len(await rows(broker, "archive", state="COMPLETED")) >= count
