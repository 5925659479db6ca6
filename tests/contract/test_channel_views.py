"""What an operator reads of channels through the engine contract, on every engine: when
the longest-waiting message of a channel became due, how many of its messages ended over a
window, and its live messages in publish order."""

from __future__ import annotations

from sqlmq.channels import ChannelSettings
from sqlmq.lifecycle import State

from .conftest import Env, ids
from .test_channels import done, publish


async def test_a_channel_lists_when_its_oldest_waiting_message_became_due(env: Env) -> None:
    await env.engine.set_channel("a", "q", ChannelSettings(max_concurrency=1))
    before = await env.engine.now()
    first = await publish(env, "a", 2)
    await publish(env, "b", 1, delay=60)
    await env.engine.set_channel("idle", "q", ChannelSettings(rate=5))
    found = {c.name: c for c in await env.engine.channels()}
    a, b, idle = found["a"], found["b"], found["idle"]
    assert a.oldest_ready_at is not None and before <= a.oldest_ready_at <= await env.engine.now()
    assert b.oldest_ready_at is not None and (b.oldest_ready_at - before).total_seconds() > 59
    assert idle.oldest_ready_at is None and (idle.waiting, idle.running) == (0, 0)
    (d,) = await env.engine.acquire(["q"], 1, 30)
    assert d.id == first[0]
    a = next(c for c in await env.engine.channels() if c.name == "a")
    assert (a.waiting, a.running) == (1, 1)  # the running one counts no more as waiting
    assert a.oldest_ready_at is not None


async def test_what_a_channel_served_is_counted_over_the_window(env: Env) -> None:
    await publish(env, "a", 3)
    await publish(env, "b", 1)
    await env.publish("q")  # a plain message: no channel's
    taken = await env.engine.acquire(["q"], 10, 30)
    assert len(taken) == 5
    assert len(await env.engine.settle([done(d) for d in taken])) == 5
    assert await env.engine.channel_served(60) == {"a": 3, "b": 1}  # the plain one: none
    await env.passes(0.3)
    assert await env.engine.channel_served(0.1) == {}


async def test_a_channels_live_messages_come_in_publish_order(env: Env) -> None:
    sent = await publish(env, "a", 3)
    await publish(env, "b", 2)
    (d, *_) = await env.engine.acquire(["q"], 1, 30)
    listed = await env.engine.channel_messages("a", 10)
    assert ids(listed) == sent and {v.channel for v in listed} == {"a"}
    assert all(v.live for v in listed)
    assert {v.id: v.state for v in listed}[d.id] == State.PROCESSING
    assert ids(await env.engine.channel_messages("a", 2)) == sent[:2]
    assert await env.engine.settle([done(d)]) == {d.id}
    assert ids(await env.engine.channel_messages("a", 10)) == [i for i in sent if i != d.id]
    assert await env.engine.channel_messages("nope", 10) == []
