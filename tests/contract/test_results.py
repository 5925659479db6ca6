"""Results through the engine contract, on every engine: a settlement's ``result`` is kept on
its archive row by the settle that archives it, fenced as the settle is, and ``answers``
reads how messages stand, live or archived (see sqlmq.engines.sql.results)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.exc import StatementError

from sqlmq.codec import decode_state, encode_state
from sqlmq.lifecycle import Outcome
from sqlmq.records import Answer, NewMessages, Settlement

from .conftest import Env


def kept(value: object) -> bytes:
    return encode_state(value)


async def test_a_result_is_kept_on_the_archive_row_of_the_settlement_that_lands(
        env: Env) -> None:
    sent = await env.publish("q", b"a", b"b", b"c", b"d", b"e")
    a, b, c, d, e = await env.engine.acquire(["q"], 10, 30)
    written = await env.engine.settle([
        Settlement(a.id, 1, Outcome.COMPLETE, result=kept({"url": "a.png"}), answers=True),
        Settlement(b.id, 1, Outcome.COMPLETE, result=kept(b"\x00raw"), answers=True),
        Settlement(c.id, 1, Outcome.COMPLETE),  # a subscriber that keeps no results
        Settlement(d.id, 1, Outcome.FAIL, error="ValueError: bad\n\ntraceback", answers=True),
        # a result on any other outcome is not kept (the runtime never sets one there)
        Settlement(e.id, 1, Outcome.EXPIRE, error="expired", attempted=False,
                   result=kept("never"), answers=True),
    ])
    assert written == set(sent)
    found = await env.engine.answers(sent)
    assert decode_state(found[a.id].result) == {"url": "a.png"}
    assert decode_state(found[b.id].result) == b"\x00raw"
    assert found[c.id] == Answer("COMPLETED", None, None)
    assert found[d.id] == Answer("FAILED", None, "ValueError: bad\n\ntraceback")
    assert found[e.id] == Answer("EXPIRED", None, "expired")
    assert all(answer.ended for answer in found.values())
    # a retried flush of the same settle writes nothing, and changes no result
    again = Settlement(a.id, 1, Outcome.COMPLETE, result=kept("other"), answers=True)
    assert await env.engine.settle([again]) == set()
    assert decode_state((await env.engine.answers([a.id]))[a.id].result) == {"url": "a.png"}


async def test_a_stale_delivery_keeps_no_result(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    await env.engine.acquire(["q"], 10, 0.2)  # delivery 1, its lease short
    await env.passes(0.3)
    assert await env.engine.recover_expired(10) == [msg_id]
    (second,) = await env.engine.acquire(["q"], 10, 30)
    stale = Settlement(msg_id, 1, Outcome.COMPLETE, result=kept("from delivery 1"),
                       answers=True)
    assert await env.engine.settle([stale]) == set()
    assert (await env.engine.answers([msg_id]))[msg_id] == Answer("PROCESSING")
    held = Settlement(msg_id, second.deliveries, Outcome.COMPLETE,
                      result=kept("from delivery 2"), answers=True)
    assert await env.engine.settle([held]) == {msg_id}
    assert decode_state((await env.engine.answers([msg_id]))[msg_id].result) == \
        "from delivery 2"


async def test_one_settle_of_a_batch_keeps_each_landed_result_on_its_own_row(
        env: Env) -> None:
    """A batch handler's settlements go in one settle: each keeps its own result, and the
    one whose delivery went stale keeps none while the rest land."""
    sent = await env.publish("q", b"a", b"b", b"c", b"d")
    a, stale, c, d = await env.engine.acquire(["q"], 10, 30)
    # given back (as a lost lease leaves it), and taken again by another delivery
    assert await env.engine.settle([Settlement(stale.id, 1, Outcome.RELEASE)]) == {stale.id}
    (again,) = await env.engine.acquire(["q"], 10, 30)
    assert again.id == stale.id and again.deliveries == 2
    written = await env.engine.settle([
        Settlement(a.id, 1, Outcome.COMPLETE, result=kept("ra"), answers=True),
        Settlement(stale.id, 1, Outcome.COMPLETE, result=kept("stale"), answers=True),
        Settlement(c.id, 1, Outcome.FAIL, error="UnstorableResult: too large", answers=True),
        Settlement(d.id, 1, Outcome.COMPLETE, result=kept({"n": 4}), answers=True),
    ])
    assert written == {a.id, c.id, d.id}
    found = await env.engine.answers(sent)
    assert decode_state(found[a.id].result) == "ra"
    assert found[stale.id] == Answer("PROCESSING")
    assert found[c.id] == Answer("FAILED", None, "UnstorableResult: too large")
    assert decode_state(found[d.id].result) == {"n": 4}


async def test_answers_read_waiting_running_retrying_and_archived_messages(env: Env) -> None:
    running, retrying = await env.publish("q", b"r", b"t")
    assert len(await env.engine.acquire(["q"], 10, 30)) == 2
    await env.engine.settle([Settlement(retrying, 1, Outcome.RETRY, error="again", delay=60)])
    (done,) = await env.publish("done")
    await env.engine.acquire(["done"], 10, 30)
    await env.engine.settle([Settlement(done, 1, Outcome.COMPLETE, result=kept(7))])
    waiting, cancelled = await env.publish("later", b"w", b"c")
    assert (await env.engine.cancel(cancelled)).outcome == "cancelled"
    unknown = cancelled + 1000
    found = await env.engine.answers([waiting, running, retrying, done, cancelled, unknown])
    assert {i: a.state for i, a in found.items()} == {
        waiting: "PENDING", running: "PROCESSING", retrying: "RETRYABLE",
        done: "COMPLETED", cancelled: "CANCELLED"}
    assert [found[i].ended for i in (waiting, running, retrying, done, cancelled)] == [
        False, False, False, True, True]
    assert found[retrying].error is None  # a live message's error is no answer
    assert found[cancelled].error == "cancelled"
    assert await env.engine.answers([]) == {}
    assert env.engine.answers_sync([done, retrying, unknown]) == {
        done: found[done], retrying: found[retrying]}


async def test_answers_read_more_ids_than_one_statement_names(env: Env) -> None:
    sent = await env.engine.publish(NewMessages("q", [b"m"] * 700, [{}] * 700))
    taken = await env.engine.acquire(["q"], 1000, 30)
    assert len(taken) == 700
    assert await env.engine.settle([
        Settlement(d.id, 1, Outcome.COMPLETE, result=kept(d.id), answers=True)
        for d in taken]) == set(sent)
    found = await env.engine.answers([*sent, *sent[:5]])  # repeats read once
    assert {i: decode_state(a.result) for i, a in found.items()} == {i: i for i in sent}


async def test_a_requeued_dead_letter_answers_as_waiting_then_with_its_new_result(
        env: Env) -> None:
    (msg_id,) = await env.publish("q")
    await env.engine.acquire(["q"], 10, 30)
    await env.engine.settle([Settlement(msg_id, 1, Outcome.FAIL, error="boom", answers=True)])
    assert (await env.engine.answers([msg_id]))[msg_id] == Answer("FAILED", None, "boom")
    assert await env.engine.requeue_archived(ids=[msg_id]) == 1
    assert (await env.engine.answers([msg_id]))[msg_id] == Answer("PENDING")
    (again,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([Settlement(msg_id, again.deliveries, Outcome.COMPLETE,
                                               result=kept("second run"))]) == {msg_id}
    answer = (await env.engine.answers([msg_id]))[msg_id]
    assert (answer.state, decode_state(answer.result)) == ("COMPLETED", "second run")


async def test_the_endings_of_defer_and_cancel_answer(env: Env) -> None:
    deferred, flagged = await env.publish("q", b"d", b"f")
    await env.engine.acquire(["q"], 10, 30)
    assert (await env.engine.cancel(flagged)).outcome == "requested"
    assert await env.engine.settle([
        Settlement(deferred, 1, Outcome.DEFER, delay=60, attempted=False, answers=True),
        Settlement(flagged, 1, Outcome.DEFER, delay=60, attempted=False, answers=True),
    ]) == {deferred, flagged}
    found = await env.engine.answers([deferred, flagged])
    assert (found[deferred].state, found[flagged].state) == ("PENDING", "CANCELLED")


# The in-memory engine keeps headers as given: nothing it is handed fails to insert.
@pytest.mark.parametrize("env", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_a_result_is_rolled_back_with_its_settle(env: Env) -> None:
    x, y = await env.publish("in", b"x", b"y")
    await env.engine.acquire(["in"], 10, 30)
    unwritable = NewMessages("out", [b"X"], [{"h": object()}])  # type: ignore[dict-item]
    with pytest.raises((TypeError, StatementError), match="not JSON serializable"):
        await env.engine.settle([
            Settlement(x, 1, Outcome.COMPLETE, outputs=unwritable),
            Settlement(y, 1, Outcome.COMPLETE, result=kept("y"), answers=True),
        ])
    found = await env.engine.answers([x, y])
    assert (found[x].state, found[y].state) == ("PROCESSING", "PROCESSING")
    assert await env.engine.settle([Settlement(y, 1, Outcome.COMPLETE, result=kept("y"))]) \
        == {y}
    assert decode_state((await env.engine.answers([y]))[y].result) == "y"


async def test_only_postgresql_pushes_the_endings_a_caller_may_wait_for(env: Env) -> None:
    """PostgreSQL's LISTEN hears, at each commit, the ids of the settlements written with
    ``answers`` and of the messages cancelled while they waited; never a stale settlement's
    nor one without ``answers``. The other engines push nothing (their waiters poll, watch
    the commit counter, or are woken by their own process)."""
    heard: list[int] = []
    connected = asyncio.Event()
    source = env.engine.answer_source(heard.extend, connected.set)
    if env.kind != "postgresql":
        assert source is None
        return
    assert source is not None
    source.start()
    try:
        await asyncio.wait_for(connected.wait(), 20)
        told, quiet, stale, waiting = await env.publish("q", b"t", b"q", b"s", b"w")
        await env.engine.acquire(["q"], 3, 30)
        await env.engine.settle([
            Settlement(told, 1, Outcome.COMPLETE, result=kept(1), answers=True),
            Settlement(quiet, 1, Outcome.COMPLETE),
            Settlement(stale, 2, Outcome.FAIL, error="not mine", answers=True),
        ])
        assert (await env.engine.cancel(waiting)).outcome == "cancelled"
        for _ in range(400):
            if len(heard) >= 2:
                break
            await asyncio.sleep(0.05)
        assert heard == [told, waiting]
    finally:
        await source.stop()
