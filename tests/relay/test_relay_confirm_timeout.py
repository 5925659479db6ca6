"""The RabbitMQ target's confirm timeout, kept by one sweeper task rather than a loop timer
per publish: a send whose confirmation does not come fails with TimeoutError after about
``confirm_timeout``, and no cancellation of the sweeper's is left on the sending task, even
when the confirmation came just as the sweeper gave up on it. RabbitMQ itself is stubbed:
these are the timings a real broker cannot be made to produce on demand."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

pytest.importorskip("aio_pika")

from sqlmq.relay.envelope import Envelope
from sqlmq.relay.target import target_for
from sqlmq.relay.targets import rabbitmq

TIMEOUT = 0.3


class Frames:
    """aiormq's channel as the target uses it: ``basic_publish`` returns once ``confirm``
    says so."""

    def __init__(self, confirm: Any) -> None:
        self.confirm = confirm
        self.published = 0

    async def basic_publish(self, body: bytes, **options: Any) -> None:
        self.published += 1
        assert "timeout" not in options  # no loop timer per publish
        await self.confirm()


def target_with(frames: Frames) -> Any:
    target = target_for("amqp://guest:guest@127.0.0.1:5672/", {"routing_key": "q"}, TIMEOUT)
    target._channel = type("Open", (), {"is_closed": False})()
    target._frames = frames
    return target


def envelope(n: int = 1) -> Envelope:
    return Envelope.of(type("M", (), {  # the fields Envelope.of reads from a Message
        "id": n, "queue": "q", "payload": b"x", "headers": {}, "content_type": None,
        "created_at": datetime.now(UTC), "channel": None})())


async def test_a_confirmation_that_never_comes_times_out_and_leaves_no_cancel() -> None:
    never = asyncio.Event()
    target = target_with(Frames(never.wait))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError, match="did not confirm"):
        await target.send(envelope())
    took = loop.time() - started
    assert TIMEOUT <= took < TIMEOUT + rabbitmq.SWEEP_EVERY + 0.5
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.01)  # no cancellation left to hit the next await


async def test_confirmed_sends_are_not_cancelled_and_the_sweeper_forgets_them() -> None:
    async def soon() -> None:
        await asyncio.sleep(0.01)

    target = target_with(Frames(soon))
    results = await asyncio.gather(*(target.send(envelope(n)) for n in range(200)))
    assert results == [False] * 200
    await asyncio.sleep(TIMEOUT + 2 * rabbitmq.SWEEP_EVERY)
    assert not target._deadlines
    assert target._sweeper is not None and target._sweeper.done()


async def test_a_confirmation_that_comes_as_the_sweeper_gives_up_is_a_success() -> None:
    target: Any = None

    async def confirmed_as_it_expires() -> None:
        # the sweeper fires between the confirmation and the send's return
        waiting = target._deadlines[-1]
        waiting[2] = True
        waiting[1].cancel()

    target = target_with(Frames(confirmed_as_it_expires))
    assert await target.send(envelope()) is False
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.01)  # the sweeper's cancel was taken back, not left pending


async def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    never = asyncio.Event()
    target = target_with(Frames(never.wait))
    sending = asyncio.create_task(target.send(envelope()))
    await asyncio.sleep(0.05)
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
