"""Workflows on the engine contract (sqlmq.workflows): a step that waits is invisible to
every acquire until the settle that ends its last dependency releases it, in that settle's
transaction and only if the settle landed; a dependency that does not complete cancels what
waits on it, transitively, unless a step runs on failure; a released step enters its channel
as a publish would."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest
from sqlalchemy import text

from sqlmq.channels import ChannelSettings
from sqlmq.codec import encode_state
from sqlmq.errors import PublishError
from sqlmq.lifecycle import Outcome, State
from sqlmq.records import Delivery, NewMessages, Settlement
from sqlmq.workflows.records import STEP_HEADER, WORKFLOW_HEADER, OnFailure, StepSpec

from .conftest import Env, ids


def step(name: str, after: Sequence[int] = (), *, queue: str = "q", flow: str = "wf",
         on_failure: OnFailure = OnFailure.CANCEL, channel: str | None = None,
         delay: float = 0.0) -> StepSpec:
    headers = {WORKFLOW_HEADER: flow, STEP_HEADER: name}
    return StepSpec(name, NewMessages(queue, [name.encode()], [headers], delay=delay,
                                      channel=channel), list(after), on_failure)


def done(d: Delivery, outcome: Outcome = Outcome.COMPLETE, result: object = None,
         **kw: object) -> Settlement:
    """The settlement of step delivery ``d``, as the runtime marks a step's."""
    return Settlement(d.id, d.deliveries, outcome, step=True,
                      result=None if result is None else encode_state(result), **kw)


async def states(env: Env, flow: str = "wf") -> dict[str, str]:
    return {s.name: s.state for s in await env.engine.workflow_steps(flow)}


async def test_a_step_waits_until_every_dependency_completed(env: Env) -> None:
    a, b, c = await env.engine.publish_workflow("wf", [step("a"), step("b"),
                                                       step("c", [0, 1])])
    got = await env.engine.acquire(["q"], 10, 30)
    assert sorted(ids(got)) == [a, b]  # c waits: no acquire takes it
    assert (await env.stats()).pending == 0
    assert await states(env) == {"a": "PROCESSING", "b": "PROCESSING", "c": "WAITING"}
    da, db = sorted(got, key=lambda d: d.id)
    assert await env.engine.settle([done(da, result={"paid": 7})]) == {a}
    assert await env.engine.acquire(["q"], 10, 30) == []  # b has not ended yet
    assert await env.engine.settle([done(db, result="packed")]) == {b}
    (dc,) = await env.engine.acquire(["q"], 10, 30)  # released by b's settle
    assert dc.id == c
    deps = {d.name: d for d in await env.engine.dependencies(c)}
    assert {n: (d.state, d.result) for n, d in deps.items()} == {
        "a": ("COMPLETED", {"paid": 7}), "b": ("COMPLETED", "packed")}
    assert await env.engine.dependencies(a) == []


async def test_a_stale_settle_of_a_dependency_releases_nothing(env: Env) -> None:
    a, b = await env.engine.publish_workflow("wf", [step("a"), step("b", [0])])
    (first,) = await env.engine.acquire(["q"], 10, 0.2)
    await env.passes(0.3)
    assert await env.engine.recover_expired(10) == [a]
    (second,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([done(first)]) == set()  # fenced out: ends nothing
    assert await env.engine.acquire(["q"], 10, 30) == []
    assert (await states(env))["b"] == "WAITING"
    assert await env.engine.settle([done(second)]) == {a}
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [b]


async def test_a_failed_dependency_cancels_what_waits_on_it_and_a_run_anyway_step_runs(
    env: Env,
) -> None:
    a, b, c, d = await env.engine.publish_workflow("wf", [
        step("a"), step("b", [0]), step("c", [1]), step("d", [0], on_failure=OnFailure.RUN)])
    (da,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([done(da, Outcome.FAIL, error="card declined")]) == {a}
    (dd,) = await env.engine.acquire(["q"], 10, 30)
    assert dd.id == d
    assert await states(env) == {"a": "FAILED", "b": "CANCELLED", "c": "CANCELLED",
                                 "d": "PROCESSING"}
    status = {s.name: s for s in await env.engine.workflow_steps("wf")}
    assert "dependency a" in (status["b"].error or "") and "FAILED" in (status["b"].error or "")
    assert "dependency b" in (status["c"].error or "")
    (dep,) = await env.engine.dependencies(d)
    assert (dep.name, dep.state, dep.ok, dep.error) == ("a", "FAILED", False, "card declined")
    assert {c, b}.isdisjoint(ids(await env.engine.acquire(["q"], 10, 30)))


async def test_cancelling_a_waiting_step_cancels_its_dependents_and_no_settle_revives_them(
    env: Env,
) -> None:
    a, b, _ = await env.engine.publish_workflow("wf", [step("a"), step("b", [0]),
                                                       step("c", [1])])
    cancelled = await env.engine.cancel(b)
    assert (cancelled.outcome, cancelled.state) == ("cancelled", State.CANCELLED)
    assert await states(env) == {"a": "PENDING", "b": "CANCELLED", "c": "CANCELLED"}
    (da,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([done(da)]) == {a}
    assert await env.engine.acquire(["q"], 10, 30) == []
    assert await states(env) == {"a": "COMPLETED", "b": "CANCELLED", "c": "CANCELLED"}


async def test_a_fan_in_is_released_once_by_the_last_of_many_dependencies(env: Env) -> None:
    n = 40
    published = await env.engine.publish_workflow(
        "wf", [step(f"s{i}") for i in range(n)] + [step("join", list(range(n)))])
    join = published[-1]
    got = await env.engine.acquire(["q"], 100, 30)
    assert sorted(ids(got)) == published[:-1]
    # one batch of settles, then the last one alone
    assert await env.engine.settle([done(d) for d in got[:-1]]) == set(ids(got[:-1]))
    assert await env.engine.acquire(["q"], 10, 30) == []
    assert await env.engine.settle([done(got[-1])]) == {got[-1].id}
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [join]
    assert len(await env.engine.dependencies(join)) == n


async def test_a_deferred_step_releases_nothing_until_it_completes(env: Env) -> None:
    a, b = await env.engine.publish_workflow("wf", [step("a"), step("b", [0])])
    (da,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([done(da, Outcome.DEFER, delay=0.0)]) == {a}
    (again,) = await env.engine.acquire(["q"], 10, 30)
    assert again.id == a  # b still waits: a defer ends nothing
    assert await env.engine.settle([done(again)]) == {a}
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [b]


async def test_a_cancel_asked_while_a_step_runs_ends_it_at_its_defer_and_cancels_after(
    env: Env,
) -> None:
    a, _ = await env.engine.publish_workflow("wf", [step("a"), step("b", [0])])
    (da,) = await env.engine.acquire(["q"], 10, 30)
    assert (await env.engine.cancel(a)).outcome == "requested"
    assert await env.engine.settle([done(da, Outcome.DEFER, delay=0.0)]) == {a}
    assert await states(env) == {"a": "CANCELLED", "b": "CANCELLED"}


async def test_a_step_delay_counts_from_its_release(env: Env) -> None:
    a, b = await env.engine.publish_workflow("wf", [step("a"), step("b", [0], delay=0.3)])
    (da,) = await env.engine.acquire(["q"], 10, 30)
    await env.passes(0.4)  # longer than b's delay: it must not have started counting
    assert await env.engine.settle([done(da)]) == {a}
    came = await env.acquire_early()
    await env.passes(0.35)
    assert ids(came or await env.engine.acquire(["q"], 10, 30)) == [b]


async def test_released_steps_enter_their_ordered_and_limited_channels(env: Env) -> None:
    await env.engine.set_channel("o", "q", ChannelSettings(ordered=True))
    await env.engine.set_channel("l", "q", ChannelSettings(max_concurrency=1))
    a, o1, o2, l1, l2 = await env.engine.publish_workflow("wf", [
        step("a"), step("o1", [0], channel="o"), step("o2", [0], channel="o"),
        step("l1", [0], channel="l"), step("l2", [0], channel="l")])
    (da,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([done(da)]) == {a}
    first = await env.engine.acquire(["q"], 10, 30)
    assert sorted(ids(first)) == [o1, l1]  # one of each channel at a time
    assert await env.engine.acquire(["q"], 10, 30) == []
    assert await env.engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE, step=True)
                                    for d in first]) == {o1, l1}
    assert sorted(ids(await env.engine.acquire(["q"], 10, 30))) == [o2, l2]


async def test_a_workflow_name_names_one_publish(env: Env) -> None:
    await env.engine.publish_workflow("wf", [step("a")])
    with pytest.raises(PublishError, match="exists already"):
        await env.engine.publish_workflow("wf", [step("b")])
    assert [s.name for s in await env.engine.workflow_steps("wf")] == ["a"]
    assert await env.engine.workflow_steps("nothing") == []


async def test_a_workflow_published_in_a_rolled_back_transaction_leaves_nothing(
    env: Env,
) -> None:
    async with env.outbox_db.connect() as conn:
        await conn.execute(text("SELECT 1"))  # in a transaction
        await env.engine.publish_workflow("wf", [step("a"), step("b", [0])], conn)
        await conn.rollback()
    assert await env.engine.workflow_steps("wf") == []
    assert await env.engine.acquire(["q"], 10, 30) == []
    async with env.outbox_db.begin() as conn:
        a, _ = await env.engine.publish_workflow("wf", [step("a"), step("b", [0])], conn)
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [a]
    assert await states(env) == {"a": "PROCESSING", "b": "WAITING"}


async def test_the_list_counts_each_workflows_steps(env: Env) -> None:
    await env.engine.publish_workflow("one", [step("a", flow="one"), step("b", [0], flow="one")])
    await env.engine.publish_workflow("two", [step("a", flow="two")])
    (d1, d2) = await env.engine.acquire(["q"], 10, 30)
    await env.engine.settle([done(d1), done(d2, Outcome.FAIL)])
    listed = {w.name: (w.steps, w.ended, w.completed) for w in await env.engine.workflows(10)}
    assert listed["two"][0] == 1 and listed["one"][0] == 2
    assert sum(w[1] for w in listed.values()) == 2  # a of one and a of two ended
    assert len(await env.engine.workflows(1)) == 1


# ---- signals -------------------------------------------------------------------------------


async def waiting_for(env: Env, name: str = "ok", delay: float = 30.0) -> Delivery:
    """A message whose first run waits for signal ``name`` (a defer of ``delay``)."""
    await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([Settlement(d.id, 1, Outcome.DEFER, delay=delay,
                                               waits_for=name)]) == {d.id}
    return d


async def test_a_signal_makes_a_message_that_waits_for_it_due_at_once(env: Env) -> None:
    d = await waiting_for(env)
    assert await env.engine.acquire(["q"], 10, 30) == []
    assert await env.engine.signal(d.id, "other", None)  # kept, but not what it waits for
    assert await env.engine.acquire(["q"], 10, 30) == []
    assert await env.engine.signal(d.id, "ok", encode_state({"by": "ann"}))
    (again,) = await env.engine.acquire(["q"], 10, 30)
    got = await env.engine.received_signal(d.id, again.deliveries)
    assert got is not None and (got.name, got.payload, got.timed_out) == (
        "ok", {"by": "ann"}, False)


async def test_a_signal_sent_while_the_handler_runs_is_taken_by_its_wait(env: Env) -> None:
    await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.received_signal(d.id, 1) is None  # it waits for nothing yet
    assert await env.engine.signal(d.id, "ok", encode_state(b"early"))
    assert await env.engine.settle([Settlement(d.id, 1, Outcome.DEFER, delay=30.0,
                                               waits_for="ok")]) == {d.id}
    (again,) = await env.engine.acquire(["q"], 10, 30)  # due at once
    got = await env.engine.received_signal(d.id, again.deliveries)
    assert got is not None and got.payload == b"early"
    # read: the next wait for it does not take it again
    assert await env.engine.settle([Settlement(d.id, again.deliveries, Outcome.DEFER,
                                               delay=30.0, waits_for="ok")]) == {d.id}
    assert await env.engine.acquire(["q"], 10, 30) == []


async def test_a_wait_that_times_out_reads_a_timeout(env: Env) -> None:
    d = await waiting_for(env, delay=0.3)
    came = await env.acquire_early()
    await env.passes(0.35)
    (again,) = came or await env.engine.acquire(["q"], 10, 30)
    got = await env.engine.received_signal(d.id, again.deliveries)
    assert got is not None and (got.name, got.timed_out, got.payload) == ("ok", True, None)


async def test_a_signal_to_a_message_that_ended_or_never_was_is_refused(env: Env) -> None:
    await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([Settlement(d.id, 1, Outcome.COMPLETE)]) == {d.id}
    assert not await env.engine.signal(d.id, "ok", None)
    assert not await env.engine.signal(10**9, "ok", None)


async def test_a_step_that_waits_for_a_signal_releases_its_dependents_once_it_completes(
    env: Env,
) -> None:
    a, b = await env.engine.publish_workflow("wf", [step("a"), step("b", [0])])
    (da,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([done(da, Outcome.DEFER, delay=30.0,
                                         waits_for="approved")]) == {a}
    assert await env.engine.acquire(["q"], 10, 30) == []
    assert await env.engine.signal(a, "approved", b"yes")
    (again,) = await env.engine.acquire(["q"], 10, 30)
    assert again.id == a and await env.engine.settle([done(again)]) == {a}
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [b]


async def test_requeueing_a_failed_step_revives_what_its_failure_cancelled(env: Env) -> None:
    a, b, c, d, _ = await env.engine.publish_workflow("wf", [
        step("a"), step("b", [0]), step("c", [1]), step("d"), step("e", [0, 3])])
    got = {x.id: x for x in await env.engine.acquire(["q"], 10, 30)}
    assert set(got) == {a, d}
    assert await env.engine.settle([done(got[a], Outcome.FAIL, error="boom"),
                                    done(got[d], Outcome.FAIL, error="also")]) == {a, d}
    assert await states(env) == {"a": "FAILED", "b": "CANCELLED", "c": "CANCELLED",
                                 "d": "FAILED", "e": "CANCELLED"}
    assert await env.engine.cancel(b) is not None  # archived already: nothing changes
    assert await env.engine.requeue_archived(ids=[a]) == 1
    # b and c wait again; e stays cancelled, d (also its dependency) having failed too
    assert await states(env) == {"a": "PENDING", "b": "WAITING", "c": "WAITING",
                                 "d": "FAILED", "e": "CANCELLED"}
    (again,) = await env.engine.acquire(["q"], 10, 30)
    assert again.id == a and await env.engine.settle([done(again)]) == {a}
    (db,) = await env.engine.acquire(["q"], 10, 30)
    assert db.id == b and await env.engine.settle([done(db)]) == {b}
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [c]


async def test_a_step_cancelled_by_hand_is_not_revived_by_a_requeue(env: Env) -> None:
    a, b = await env.engine.publish_workflow("wf", [step("a"), step("b", [0])])
    assert (await env.engine.cancel(b)).outcome == "cancelled"
    (da,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.settle([done(da, Outcome.FAIL)]) == {a}
    assert await env.engine.requeue_archived(ids=[a]) == 1
    assert await states(env) == {"a": "PENDING", "b": "CANCELLED"}


async def test_the_signals_of_ended_messages_are_forgotten_once_old_enough(env: Env) -> None:
    d = await waiting_for(env)
    assert await env.engine.signal(d.id, "ok", None)
    (again,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.signal(d.id, "late", None)  # never waited for
    await env.publish("q")
    (live,) = await env.engine.acquire(["q"], 10, 30)
    assert await env.engine.signal(live.id, "ok", None)
    assert await env.engine.settle([Settlement(d.id, again.deliveries,
                                               Outcome.COMPLETE)]) == {d.id}
    now = await env.engine.now()
    assert await env.engine.forget_ended_signals(now - timedelta(hours=1), 10) == 0  # recent
    assert await env.engine.forget_ended_signals(now + timedelta(seconds=1), 10) == 1
    assert await env.engine.forget_ended_signals(now + timedelta(seconds=1), 10) == 0
    # the live message's signal stays: its wait reads it
    assert await env.engine.settle([Settlement(live.id, 1, Outcome.DEFER, delay=30.0,
                                               waits_for="ok")]) == {live.id}
    (back,) = await env.engine.acquire(["q"], 10, 30)
    got = await env.engine.received_signal(live.id, back.deliveries)
    assert got is not None and not got.timed_out
