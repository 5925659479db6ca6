"""A defer, the cancel of the running head and a pipeline step's output on an ordered or a
concurrency-limited channel, through the broker, on every engine: the result is written,
the channel goes on, and every message after it runs, in order where the channel is
ordered. (On MariaDB these once stalled an ordered channel: the result of the head could not
be written, it stayed PROCESSING and nothing after it ran.) The engine rules are
``tests/contract/test_channel_endings.py``."""

from __future__ import annotations

import asyncio
from functools import cached_property
from types import FunctionType
from typing import Any

import pytest

from sqlmq import Broker, Message, State

from .conftest import archived, on_every_engine, rows, wait_until

pytestmark = on_every_engine

QUICK = dict(flush_interval=0.0, max_fetch_interval=0.05)
LIMITS = {"ordered": dict(ordered=True), "limited": dict(max_concurrency=1)}


def no_method_hidden(engine: Any) -> list[str]:
    """The attributes the engine set on itself (in ``__init__`` or as it ran) that take the
    name of one of its class's methods (see ``tests/test_no_shadowing.py``)."""
    methods = {name for cls in type(engine).__mro__ for name, v in vars(cls).items()
               if isinstance(v, FunctionType) and not isinstance(v, cached_property)}
    return sorted(set(vars(engine)) & methods)


@pytest.mark.parametrize("how", ["defer", "cancel", "publish_to"])
@pytest.mark.parametrize("kind", list(LIMITS))
async def test_an_ending_of_a_channels_head_lets_the_channel_go_on(
        broker: Broker, kind: str, how: str) -> None:
    await broker.set_channel("c", **LIMITS[kind])  # type: ignore[arg-type]
    started: list[tuple[str, Any]] = []
    head_runs = asyncio.Event()

    @broker.subscriber("q", workers=4, publish_to="out" if how == "publish_to" else None,
                       **QUICK)
    async def handle(msg: Message) -> Any:
        started.append((msg.body, msg.state))
        if msg.body != "head":
            return "next" if how == "publish_to" else None
        if how == "defer" and msg.state is None:
            await msg.defer(state=1)
        elif how == "cancel":
            head_runs.set()
            while not msg.cancel_requested:
                await asyncio.sleep(0.01)
            raise RuntimeError("stopped on request")
        return "onward" if how == "publish_to" else None

    sent = [await broker.publish("q", body, channel="c") for body in ("head", "b", "c")]
    await broker.start()
    if how == "cancel":
        await asyncio.wait_for(head_runs.wait(), 20)
        assert (await broker.cancel(sent[0])).outcome == "requested"
    for msg_id in sent:
        await archived(broker, msg_id)
    if how == "publish_to":
        await wait_until(lambda: outputs(broker, 3), message="three outputs")
    await broker.stop()
    bodies = [body for body, _ in started]
    if how == "defer" and kind == "ordered":  # the deferred head kept its place
        assert started[:2] == [("head", None), ("head", 1)] and bodies[2:] == ["b", "c"]
    elif how == "defer":  # its slot went to the next while it waited
        assert sorted(bodies) == ["b", "c", "head", "head"] and ("head", 1) in started
    else:
        assert bodies == ["head", "b", "c"]
    states = [(await archived(broker, i))["state"] for i in sent]
    assert states == [State.CANCELLED if how == "cancel" else State.COMPLETED,
                      State.COMPLETED, State.COMPLETED]
    assert await rows(broker, "message", queue="q") == []
    assert no_method_hidden(broker.engine) == []


async def outputs(broker: Broker, n: int) -> bool:
    return len(await rows(broker, "message", queue="out")) == n
