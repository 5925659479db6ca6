"""Delete instead of archive (a subscriber's ``archive="failed"`` or ``"none"``, which
:func:`~sqlmq.lifecycle.decide` turns into ``Settlement.keep``): the settle's statement that
would archive a row deletes it, fenced the same way, in a batch that mixes both."""

from __future__ import annotations

from sqlmq.lifecycle import Outcome
from sqlmq.records import Settlement

from .conftest import Env


async def test_settlements_not_kept_delete_their_rows_and_the_rest_archive(env: Env) -> None:
    ids = await env.publish("q", b"done", b"failed", b"expired", b"kept", b"retry")
    taken = await env.engine.acquire(["q"], 10, 30)
    assert [d.id for d in taken] == ids
    done, failed, expired, kept, retry = (Settlement(i, 1, o, keep=k) for i, o, k in zip(
        ids, [Outcome.COMPLETE, Outcome.FAIL, Outcome.EXPIRE, Outcome.COMPLETE, Outcome.RETRY],
        [False, False, False, True, False], strict=True))
    batch = [done, failed, expired, kept, retry]
    assert await env.engine.settle(batch) == set(ids)
    assert await env.engine.landed(batch) == set(ids)
    stats = await env.stats()
    assert (stats.completed, stats.failed, stats.expired, stats.retryable) == (1, 0, 0, 1)
    for gone in ids[:3]:
        assert await env.engine.message_view(gone) is None
    view = await env.engine.message_view(kept.id)
    assert view is not None and view.state == "COMPLETED"


async def test_a_stale_settlement_not_kept_deletes_nothing(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    (first,) = await env.engine.acquire(["q"], 10, 0.2)
    await env.passes(0.3)
    assert await env.engine.recover_expired(10) == [msg_id]
    (second,) = await env.engine.acquire(["q"], 10, 30)
    stale = Settlement(msg_id, first.deliveries, Outcome.COMPLETE, keep=False)
    assert await env.engine.settle([stale]) == set()
    assert (await env.stats()).processing == 1  # the second delivery still holds it
    assert await env.engine.landed([stale]) == set()
    live = Settlement(msg_id, second.deliveries, Outcome.COMPLETE, keep=False)
    assert await env.engine.settle([live]) == {msg_id}
    assert await env.engine.message_view(msg_id) is None


async def test_a_cancel_not_kept_deletes_the_row(env: Env) -> None:
    a, b = await env.publish("q", b"a", b"b")
    await env.engine.acquire(["q"], 10, 30)
    await env.engine.cancel(b)  # flagged while running
    cancel = Settlement(a, 1, Outcome.CANCEL, error="cancelled", attempted=False, keep=False)
    deferred = Settlement(b, 1, Outcome.DEFER, attempted=False, keep=False,
                          history=[{"delivery": 1, "ended": "deferred"}])
    assert await env.engine.settle([cancel, deferred]) == {a, b}
    assert await env.engine.landed([cancel, deferred]) == {a, b}
    stats = await env.stats()
    assert (stats.pending, stats.processing, stats.cancelled) == (0, 0, 0)
