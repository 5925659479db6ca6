"""A pipeline step's settle: a settlement's ``outputs`` are published in the transaction
that writes it, and only if it lands (see sqlmq.engines.sql.settle_onward)."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import StatementError

from sqlmq.lifecycle import Outcome
from sqlmq.records import NewMessages, Settlement

from .conftest import Env


def outputs(*payloads: bytes, queue: str = "out", **headers: str) -> NewMessages:
    return NewMessages(queue, list(payloads), [dict(headers) for _ in payloads])


async def test_outputs_of_settlements_that_land_are_published_with_them(env: Env) -> None:
    await env.publish("in", b"a", b"b", b"c", b"d")
    a, b, c, d = await env.engine.acquire(["in"], 10, 30)
    written = await env.engine.settle([
        Settlement(a.id, 1, Outcome.COMPLETE, outputs=outputs(b"A", step="1")),
        Settlement(b.id, 1, Outcome.COMPLETE),  # a step that returned None
        Settlement(c.id, 1, Outcome.COMPLETE, outputs=outputs(b"C1", b"C2")),
        Settlement(d.id, 1, Outcome.RETRY, error="boom", delay=60),
    ])
    assert written == {a.id, b.id, c.id, d.id}
    assert (await env.stats("in")).completed == 3
    out = await env.engine.acquire(["out"], 10, 30)
    assert [(m.payload, m.headers) for m in out] == [
        (b"A", {"step": "1"}), (b"C1", {}), (b"C2", {})]
    assert all(m.id > d.id for m in out)
    assert await env.engine.landed([Settlement(a.id, 1, Outcome.COMPLETE)]) == {a.id}


async def test_a_stale_settlement_publishes_nothing(env: Env) -> None:
    (msg_id,) = await env.publish("in")
    await env.engine.acquire(["in"], 10, 0.2)  # delivery 1, its lease short
    await env.passes(0.3)
    assert await env.engine.recover_expired(10) == [msg_id]
    (second,) = await env.engine.acquire(["in"], 10, 30)
    assert second.deliveries == 2
    stale = Settlement(msg_id, 1, Outcome.COMPLETE, outputs=outputs(b"from delivery 1"))
    assert await env.engine.settle([stale]) == set()
    assert (await env.stats("out")).pending == 0
    held = Settlement(msg_id, 2, Outcome.COMPLETE, outputs=outputs(b"from delivery 2"))
    assert await env.engine.settle([held]) == {msg_id}
    (out,) = await env.engine.acquire(["out"], 10, 30)
    assert out.payload == b"from delivery 2"
    # settled again (a retried flush), the output is not written twice
    assert await env.engine.settle([held]) == set()
    assert await env.engine.acquire(["out"], 10, 30) == []


# The in-memory engine keeps headers as given: nothing it is handed fails to insert, and its
# settle and outputs are one step under its lock.
@pytest.mark.parametrize("env", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_an_output_that_fails_to_insert_rolls_the_settle_back(env: Env) -> None:
    await env.publish("in", b"x", b"y")
    x, y = await env.engine.acquire(["in"], 10, 30)
    unwritable = NewMessages("out", [b"X"], [{"h": object()}])  # type: ignore[dict-item]
    with pytest.raises((TypeError, StatementError), match="not JSON serializable"):
        await env.engine.settle([
            Settlement(x.id, 1, Outcome.COMPLETE, outputs=unwritable),
            Settlement(y.id, 1, Outcome.COMPLETE, outputs=outputs(b"Y")),
        ])
    stats = await env.stats("in")
    assert (stats.processing, stats.completed) == (2, 0)  # neither settle was kept
    assert (await env.stats("out")).pending == 0
    assert await env.engine.settle([
        Settlement(x.id, 1, Outcome.COMPLETE, outputs=outputs(b"X")),
        Settlement(y.id, 1, Outcome.COMPLETE, outputs=outputs(b"Y")),
    ]) == {x.id, y.id}
    assert sorted(m.payload for m in await env.engine.acquire(["out"], 10, 30)) == [b"X", b"Y"]
