"""What the dashboard's lists and bulk repairs need of every engine: a requeue or purge
moves exactly what an archive search finds (its filters, in batches), a count of such a
search is exact (or stops at ``most``), and a queue's live messages are told apart by what
they wait on (a delay, a defer, a signal, other steps, a cancellation, a delivery)."""

from __future__ import annotations

from sqlmq.lifecycle import Outcome
from sqlmq.records import Delivery, NewMessages, Settlement
from sqlmq.views import ArchiveQuery
from sqlmq.waits import LiveQuery, Wait
from sqlmq.workflows.records import STEP_HEADER, WORKFLOW_HEADER, OnFailure, StepSpec

from .conftest import Env, ids


async def failed(env: Env, queue: str, *errors: str,
                 outcome: Outcome = Outcome.FAIL) -> list[int]:
    """One message per error, archived with ``outcome`` and that error."""
    published = await env.publish(queue, *[e.encode() for e in errors])
    taken = await env.engine.acquire([queue], len(errors), 30)
    assert ids(taken) == published
    assert await env.engine.settle([Settlement(d.id, 1, outcome, error=e)
                                    for d, e in zip(taken, errors, strict=True)]) == set(published)
    return published


async def test_a_requeue_matching_a_search_moves_what_it_finds_in_batches(env: Env) -> None:
    timeouts = await failed(env, "q", "TimeoutError: gateway", "TimeoutError: db",
                            "TimeoutError: gateway")
    others = await failed(env, "q", "ValueError: bad", "ValueError: worse")
    (elsewhere,) = await failed(env, "other", "TimeoutError: gateway")
    await failed(env, "q", "TimeoutError: but it completed", outcome=Outcome.COMPLETE)
    search = ArchiveQuery(queue="q", states=("FAILED",), error_contains="TimeoutError")
    assert await env.engine.count_archive(search) == 3
    assert await env.engine.count_archive(search, most=2) == 2
    assert await env.engine.count_archive(ArchiveQuery(error_contains="TimeoutError")) == 5

    moved = [await env.engine.requeue_archived(state="FAILED", matching=search, limit=2)
             for _ in range(3)]
    assert moved == [2, 1, 0]
    assert sorted(ids(await env.engine.acquire(["q"], 10, 30))) == timeouts
    assert await env.engine.count_archive(search) == 0
    stats = await env.stats()
    assert (stats.failed, stats.completed) == (len(others), 1)
    assert (await env.stats("other")).failed == 1
    assert await env.engine.requeue_archived(
        state="FAILED", matching=ArchiveQuery(error_contains="TimeoutError")) == 1
    assert ids(await env.engine.acquire(["other"], 10, 30)) == [elsewhere]


async def test_a_purge_matching_a_search_deletes_only_what_it_finds(env: Env) -> None:
    (old,) = await failed(env, "q", "rate 50% hit")
    await env.passes(0.05)
    cutoff = await env.engine.now()
    await env.passes(0.05)
    (new, other_error) = await failed(env, "q", "rate 50% hit", "rate 500 hit")
    assert await env.engine.count_archive(ArchiveQuery(error_contains="50%")) == 2  # no LIKE
    assert await env.engine.count_archive(ArchiveQuery(archived_from=cutoff)) == 2
    assert await env.engine.count_archive(ArchiveQuery(archived_to=cutoff)) == 1
    assert await env.engine.purge_archived(
        matching=ArchiveQuery(queue="q", error_contains="50%", archived_to=cutoff)) == 1
    assert await env.engine.purge_archived(matching=ArchiveQuery(queue="elsewhere")) == 0
    assert await env.engine.purge_archived(matching=ArchiveQuery(error_contains="50%"),
                                           limit=5) == 1
    left = await env.engine.search_archive(ArchiveQuery())
    assert [v.id for v in left] == [other_error] and old not in ids(left) and new != old


def _defer(d: Delivery, delay: float, waits_for: str | None = None) -> Settlement:
    return Settlement(d.id, d.deliveries, Outcome.DEFER, delay=delay, attempted=False,
                      history=[*d.history, {"delivery": d.deliveries, "ended": "deferred"}],
                      waits_for=waits_for)


async def _taken(env: Env) -> Delivery:
    """A message published and taken at once (nothing else of ``q`` is due meanwhile)."""
    (msg_id,) = await env.publish("q")
    (d,) = await env.engine.acquire(["q"], 10, 30)
    assert d.id == msg_id
    return d


async def test_live_messages_say_what_each_waits_on(env: Env) -> None:
    deferred = await _taken(env)
    assert await env.engine.settle([_defer(deferred, 3600)]) == {deferred.id}
    signalled = await _taken(env)
    assert await env.engine.settle([_defer(signalled, 3600, "go")]) == {signalled.id}
    running = await _taken(env)
    cancelling = await _taken(env)
    assert (await env.engine.cancel(cancelling.id)).outcome == "requested"
    due_again = await _taken(env)  # deferred, and the defer's time has come
    assert await env.engine.settle([_defer(due_again, 0.0)]) == {due_again.id}
    (delayed,) = await env.publish("q", delay=3600)
    headers = [{WORKFLOW_HEADER: "wf", STEP_HEADER: name} for name in ("a", "b")]
    first, waiting = await env.engine.publish_workflow("wf", [
        StepSpec("a", NewMessages("q", [b"a"], [headers[0]]), [], OnFailure.CANCEL),
        StepSpec("b", NewMessages("q", [b"b"], [headers[1]]), [0], OnFailure.CANCEL)])
    (ready,) = await env.publish("q")

    expected = {deferred.id: Wait.DEFERRED, signalled.id: Wait.SIGNAL,
                running.id: Wait.RUNNING, cancelling.id: Wait.CANCELLING,
                due_again.id: Wait.READY, delayed: Wait.DELAYED, first: Wait.READY,
                waiting: Wait.STEPS, ready: Wait.READY}
    page = await env.engine.live_messages(LiveQuery("q"))
    assert {v.id: v.waits for v in page} == expected
    assert [v.id for v in page] == sorted(expected)  # oldest id first
    assert await env.engine.live_waits("q") == {"deferred": 1, "signal": 1, "running": 1,
                                                "cancelling": 1, "ready": 3, "delayed": 1,
                                                "steps": 1}
    assert await env.engine.live_waits("nothing-here") == {}

    views = {v.id: v for v in page}
    assert views[signalled.id].waits_for == "go" and views[deferred.id].waits_for is None
    assert views[running.id].acquired_at == running.acquired_at
    assert views[deferred.id].acquired_at is None
    assert views[deferred.id].first_attempt_at == deferred.acquired_at
    assert views[delayed].first_attempt_at is None
    one = await env.engine.message_view(signalled.id)
    assert one is not None and (one.waits, one.waits_for) == ("signal", "go")

    ready_ones = sorted(i for i, w in expected.items() if w is Wait.READY)
    first_page = await env.engine.live_messages(LiveQuery("q", (Wait.READY,), limit=2))
    assert [v.id for v in first_page] == ready_ones[:2]
    rest = await env.engine.live_messages(LiveQuery("q", (Wait.READY,), after=ready_ones[1]))
    assert [v.id for v in rest] == ready_ones[2:]
    both = await env.engine.live_messages(LiveQuery("q", (Wait.DEFERRED, Wait.SIGNAL)))
    assert [v.id for v in both] == [deferred.id, signalled.id]
