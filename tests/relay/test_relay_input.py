"""What a relay does with input it cannot use: a URL it cannot read is an error naming the
problem, before anything runs; a far broker it cannot reach, a stream or queue that is not
there yet, are failed attempts (the messages wait, one log line says why); a message the
far broker can never take is dead-lettered with the reason, and the others still go."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sqlmq import Broker, ConfigurationError, Relay, Retry

from ..conftest import drop_tables, rows, wait_until
from .far import JetStream, RabbitMQ, require

FAST = Retry.constant(0.1, max_attempts=None)


@pytest.mark.parametrize(("to", "options", "problem"), [
    ("rabbit://127.0.0.1", {}, "unknown broker URL scheme 'rabbit'"),
    ("127.0.0.1:5672", {}, "is not a broker URL"),
    ("nats://", {}, "has no host"),
    ("redis://127.0.0.1:port/0", {}, "port 'port' of host '127.0.0.1' is not a number"),
    ("amqp://guest:secret@127.0.0.1/?subjekt=x", {}, "unknown option subjekt"),
    ("amqp://127.0.0.1", {"subject": "orders"}, "subject is not an option of a relay to amqp"),
    ("mqtt://127.0.0.1", {"stream": "s"}, "it takes topic"),
])
def test_a_url_or_option_the_relay_cannot_use_is_an_error_naming_it(
        to: str, options: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem) as caught:
        Relay(Broker("memory://"), "outbox", to=to, **options)
    assert "secret" not in str(caught.value)  # the password is masked


def test_the_command_line_says_what_is_wrong_with_the_url(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sqlmq.cli", "relay", "outbox", "--to", "kafak://x:9092",
         "--url", f"sqlite:///{tmp_path}/db.sqlite"], capture_output=True, text=True,
        timeout=60)
    assert out.returncode == 2
    assert "unknown broker URL scheme 'kafak'" in out.stderr


@pytest.mark.parametrize(("to", "says"), [
    ("amqp://guest:guest@127.0.0.1:1/", "RabbitMQ at amqp://guest:***@127.0.0.1:1/"),
    ("nats://no-such-host.invalid:4222", "no-such-host.invalid"),
])
async def test_an_unreachable_far_broker_is_one_clear_line_and_the_messages_wait(
        to: str, says: str, broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sqlmq")
    relay = Relay(broker, "outbox", to=to, retry=FAST, connect_timeout=2)
    await broker.publish_batch("outbox", [{"n": n} for n in range(5)])
    await broker.start()
    await wait_until(lambda: relay.stats.failed >= 10, message="two tries of each message")
    await broker.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert says in lines[0] and "cannot connect" in lines[0], lines[0]
    assert await rows(broker, "archive") == []
    assert len(await rows(broker, "message")) == 5


async def test_a_body_over_the_nats_max_payload_is_dead_lettered_and_the_others_go(
        broker: Broker, prefix: str, tmp_path: Path) -> None:
    far = JetStream(f"big-{prefix.rstrip('_')}")
    await far.prepare()
    try:
        relay = Relay(broker, "outbox", to=far.url, retry=FAST, **far.options)
        small = await broker.publish("outbox", b"small")
        big = await broker.publish("outbox", b"x" * (2 * 1024 * 1024))  # NATS takes 1 MB
        last = await broker.publish("outbox", b"last")
        await broker.start()
        arrived = await far.collect(2, timeout=30)
        await wait_until(lambda: _ended(broker, 3), message="all three archived")
        assert sorted(a.id for a in arrived) == [small, last]
        (dead,) = await rows(broker, "archive", state="FAILED")
        assert dead["id"] == big and "max_payload" in dead["error"], dead["error"]
        assert (relay.stats.refused, relay.stats.failed) == (1, 0)  # the connection lived
    finally:
        await far.remove()


async def test_a_subject_no_stream_captures_is_a_failed_attempt_until_a_stream_does(
        broker: Broker, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    far = JetStream(f"late-{prefix.rstrip('_')}")
    caplog.set_level(logging.WARNING, logger="sqlmq")
    import nats

    nc = await nats.connect(far.url)
    try:
        relay = Relay(broker, "outbox", to=far.url, retry=FAST, **far.options)
        ids = await broker.publish_batch("outbox", [{"n": n} for n in range(20)])
        await broker.start()
        await wait_until(lambda: relay.stats.failed >= 20, message="every message tried")
        assert await rows(broker, "archive") == []
        far.nc, far.js = nc, nc.jetstream()
        await far.js.add_stream(name=far.stream, subjects=[f"{far.name}.>"])
        arrived = await far.collect(20, timeout=30)
        assert sorted(a.id for a in arrived) == ids
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2 and "no JetStream stream captures subject" in lines[0], lines
    finally:
        await far.remove()


async def test_an_unroutable_message_waits_until_a_queue_is_bound(
        broker: Broker, prefix: str, tmp_path: Path) -> None:
    far = RabbitMQ(f"unbound-{prefix.rstrip('_')}")
    relay = Relay(broker, "outbox", to=far.url, retry=FAST, **far.options)
    ids = await broker.publish_batch("outbox", [{"n": n} for n in range(20)])
    await broker.start()
    await wait_until(lambda: relay.stats.failed >= 20, message="every message tried")
    assert await rows(broker, "archive") == []
    await far.prepare()  # the queue now exists
    try:
        arrived = await far.collect(20, timeout=30)
        assert sorted({a.id for a in arrived}) == ids
    finally:
        await far.remove()


async def _ended(broker: Broker, count: int) -> bool:
    return len(await rows(broker, "archive")) >= count


def test_every_server_the_relay_tests_use_is_running() -> None:
    """Named on its own, so a run with a server down says which at once."""
    for kind in ("rabbitmq", "jetstream", "redis", "mqtt"):
        require(kind)


__all__ = ["drop_tables"]
