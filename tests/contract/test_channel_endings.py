"""The endings that take the settle's onward path (a defer, the cancel of a running message,
a pipeline step's outputs, a kept result) on an ordered or a concurrency-limited channel, through
``settle_passing`` as the runtime calls it, on every engine: each frees its slot or its turn
once, starts the channel's next message as a plain settle does, and leaves nothing stuck.
The combinations are tested together because each engine writes them on a path of its own
(MariaDB's one-packet settle_passing hands them to the generic path)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sqlmq.channels import ChannelSettings
from sqlmq.codec import decode_state, encode_state
from sqlmq.lifecycle import Outcome
from sqlmq.records import Delivery, NewMessages, Settlement

from .conftest import Env, ids, msg

SETTINGS = {"ordered": ChannelSettings(ordered=True),
            "limited": ChannelSettings(max_concurrency=1)}
ENDINGS = ["defer", "cancel", "publish_to", "result"]


async def publish(env: Env, n: int) -> list[int]:
    batch = NewMessages.of([msg("q", f"c-{i}".encode()) for i in range(n)])
    return await env.engine.publish(replace(batch, channel="c"))


def slots(*deliveries: Delivery) -> dict[int, str]:
    return {d.id: "c" for d in deliveries}


async def ending(env: Env, how: str, d: Delivery) -> Settlement:
    """The settlement the runtime writes when the handler of ``d`` ends ``how``."""
    if how == "defer":
        return Settlement(d.id, d.deliveries, Outcome.DEFER, delay=0.3, attempted=False,
                          saved_state=b"kept")
    if how == "cancel":
        assert (await env.engine.cancel(d.id)).outcome == "requested"
        return Settlement(d.id, d.deliveries, Outcome.CANCEL, error="cancelled",
                          attempted=False)
    if how == "result":
        return Settlement(d.id, d.deliveries, Outcome.COMPLETE, result=encode_state("thumb"),
                          answers=True)
    return Settlement(d.id, d.deliveries, Outcome.COMPLETE,
                      outputs=NewMessages("out", [b"onward"], [{}]))


async def drain(env: Env, first: list[Delivery]) -> list[int]:
    """Complete what runs and what each settle passes on, acquiring when nothing runs, until
    the channel is empty; the ids in the order they started."""
    order: list[int] = []
    running = first
    for _ in range(50):
        if not running:
            await env.passes(0.05)
            running = await env.engine.acquire(["q"], 10, 30)
            if not running:
                if (await env.stats()).pending == 0:
                    return order
                continue  # a deferred message not due yet
        assert len(running) == 1, f"more than one of the channel at once: {ids(running)}"
        order += ids(running)
        applied, running = await env.engine.settle_passing(
            [Settlement(d.id, d.deliveries, Outcome.COMPLETE) for d in running],
            slots(*running), ["q"], 30, 10)
        assert applied == set(order[-1:])
    raise AssertionError(f"the channel never emptied: started {order}")


@pytest.mark.parametrize("how", ENDINGS)
@pytest.mark.parametrize("kind", list(SETTINGS))
async def test_an_onward_ending_passes_the_channel_on_and_leaves_nothing_stuck(
        env: Env, kind: str, how: str) -> None:
    await env.engine.set_channel("c", "q", SETTINGS[kind])
    sent = await publish(env, 3)
    (head,) = await env.engine.acquire(["q"], 10, 30)
    assert head.id == sent[0]
    settlement = await ending(env, how, head)
    applied, started = await env.engine.settle_passing([settlement], slots(head), ["q"], 30,
                                                       10)
    assert applied == {sent[0]}
    if kind == "ordered" and how == "defer":
        # a deferred head keeps its place: nothing passes it, and it comes back first. The
        # settle's onward path passes the channel on after its transaction: where that took
        # longer than the defer (a loaded machine), the head is due again and starts there.
        assert ids(started) in ([], [sent[0]])
        if started:
            (again,) = started
        else:
            await env.passes(0.35)
            (again,) = await env.engine.acquire(["q"], 10, 30)
        assert (again.id, again.saved_state, again.defers) == (sent[0], b"kept", 1)
        assert await drain(env, [again]) == sent
        return
    assert ids(started) == [sent[1]]
    assert started[0].holds_slot and started[0].channel == "c"
    rest = await drain(env, started)
    if how == "defer":  # a limited channel's deferred message waits its turn again
        assert sorted(rest) == sent
        assert rest[0] == sent[1]
    else:
        assert rest == sent[1:]
    stats = await env.stats()
    assert (stats.pending, stats.processing, stats.retryable) == (0, 0, 0)
    if how == "cancel":
        assert (stats.cancelled, stats.completed) == (1, 2)
    if how == "publish_to":
        (out,) = await env.engine.acquire(["out"], 10, 30)
        assert out.payload == b"onward"
    if how == "result":
        kept = await env.engine.answers(sent)
        assert decode_state(kept[sent[0]].result) == "thumb"
        assert [kept[i].result for i in sent[1:]] == [None, None]
    assert {c.name: c.running for c in await env.engine.channels()}.get("c", 0) == 0
