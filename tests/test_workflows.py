"""Workflows end to end, on every database and the in-memory engine: steps in several
queues with their own subscribers run after their dependencies and read their results; a
failure cancels what waits on it unless a step runs anyway; a workflow is cancelled as a
whole; its status says where each step is (sqlmq.workflows). The engine's side, step by
step: tests/contract/test_workflows.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sqlmq import Broker, Message, PublishError, Retry, UnknownWorkflow
from sqlmq.workflows.records import STEP_HEADER, WORKFLOW_HEADER

from .conftest import on_every_engine, wait_until


@on_every_engine
async def test_steps_run_after_their_dependencies_and_read_their_results(
    broker: Broker,
) -> None:
    ran: list[str] = []
    seen: dict[str, Any] = {}

    @broker.subscriber("charge", flush_interval=0.01)
    async def charge(order: dict[str, Any]) -> dict[str, Any]:
        ran.append("charge")
        return {"paid": order["total"]}

    @broker.subscriber("ship", flush_interval=0.01)
    async def ship(msg: Message) -> str:
        deps = await msg.dependencies()
        ran.append("ship")
        return f"shipped {msg.body['id']} after paying {deps['charge'].result['paid']}"

    @broker.subscriber("email", flush_interval=0.01)
    async def email(msg: Message) -> None:
        deps = await msg.dependencies()
        seen.update({name: d.result for name, d in deps.items()})
        seen["step"] = (msg.workflow, msg.step)
        ran.append("email")

    await broker.start()
    try:
        flow = broker.workflow("order-7")
        a = flow.add("charge", {"id": 7, "total": 30})
        b = flow.add("ship", {"id": 7}, after=[a])
        flow.add("email", {"id": 7}, after=[a, b])
        ids = await flow.publish()
        await wait_until(lambda: len(ran) == 3, message="three steps")
        status = await broker.workflow_status("order-7")
        await wait_until(lambda: _ended(broker, "order-7"), message="the workflow ended")
    finally:
        await broker.stop()
    assert ran == ["charge", "ship", "email"]
    assert seen == {"charge": {"paid": 30}, "ship": "shipped 7 after paying 30",
                    "step": ("order-7", "email")}
    status = await broker.workflow_status("order-7")
    assert status.state == "COMPLETED"
    assert [(s.name, s.id, s.state, s.after) for s in status.steps] == [
        ("charge", ids["charge"], "COMPLETED", []),
        ("ship", ids["ship"], "COMPLETED", ["charge"]),
        ("email", ids["email"], "COMPLETED", ["charge", "ship"])]
    assert status.step("ship").result == "shipped 7 after paying 30"


async def _ended(broker: Broker, name: str) -> bool:
    return (await broker.workflow_status(name)).ended


@on_every_engine
async def test_a_failure_cancels_what_waits_on_it_and_a_run_anyway_step_reads_it(
    broker: Broker,
) -> None:
    cleanup: list[tuple[str, str | None]] = []

    @broker.subscriber("charge", retry=Retry.none(), flush_interval=0.01)
    async def charge(order: dict[str, Any]) -> None:
        raise ValueError("card declined")

    @broker.subscriber("ship", flush_interval=0.01)
    async def ship(order: dict[str, Any]) -> None:
        raise AssertionError("must not run")

    @broker.subscriber("refund", flush_interval=0.01)
    async def refund(msg: Message) -> None:
        dep = (await msg.dependencies())["charge"]
        cleanup.append((dep.state, dep.error))

    await broker.start()
    try:
        flow = broker.workflow("order-8")
        a = flow.add("charge", {"id": 8})
        b = flow.add("ship", {"id": 8}, after=[a])
        flow.add("email", {"id": 8}, after=[b])  # no subscriber: cancelled all the same
        flow.add("refund", {"id": 8}, after=[a], on_failure="run")
        await flow.publish()
        await wait_until(lambda: _ended(broker, "order-8"), message="the workflow ended")
    finally:
        await broker.stop()
    status = await broker.workflow_status("order-8")
    assert {s.name: s.state for s in status.steps} == {
        "charge": "FAILED", "ship": "CANCELLED", "email": "CANCELLED", "refund": "COMPLETED"}
    assert status.state == "FAILED"
    assert "card declined" in (cleanup[0][1] or "") and cleanup[0][0] == "FAILED"
    assert "charge" in (status.step("ship").error or "")


@on_every_engine
async def test_cancelling_a_workflow_cancels_its_waiting_and_running_steps(
    broker: Broker,
) -> None:
    started = asyncio.Event()

    @broker.subscriber("slow", flush_interval=0.01, lease=1.5)
    async def slow(msg: Message) -> None:
        started.set()
        while not msg.cancel_requested:
            await asyncio.sleep(0.02)
        raise RuntimeError("stopped")

    await broker.start()
    try:
        flow = broker.workflow("nightly")
        a = flow.add("slow", "a")
        flow.add("report", "b", after=[a])
        flow.add("other", "c")
        await flow.publish()
        await asyncio.wait_for(started.wait(), 20)
        cancelled = await broker.cancel_workflow("nightly")
        assert {n: c.outcome for n, c in cancelled.items()} == {
            "report": "cancelled", "slow": "requested", "other": "cancelled"}
        await wait_until(lambda: _ended(broker, "nightly"), message="the workflow ended")
    finally:
        await broker.stop()
    status = await broker.workflow_status("nightly")
    assert {s.name: s.state for s in status.steps} == {
        "slow": "CANCELLED", "report": "CANCELLED", "other": "CANCELLED"}


@on_every_engine
async def test_what_a_workflow_refuses(broker: Broker) -> None:
    flow = broker.workflow("w")
    with pytest.raises(PublishError, match="no steps"):
        await flow.publish()
    a = flow.add("q", 1)
    with pytest.raises(PublishError, match="after= takes steps"):
        flow.add("q", 2, after=[broker.workflow("other").add("q", 3)])
    with pytest.raises(PublishError, match="on_failure"):
        flow.add("q", 2, after=[a], on_failure="ignore")
    assert flow.add("q", 2, after=[a]).name == "q-2"
    await flow.publish()
    again = broker.workflow("w")
    again.add("q", 1)
    with pytest.raises(PublishError, match="exists already"):
        await again.publish()
    with pytest.raises(UnknownWorkflow, match="'nope'"):
        await broker.workflow_status("nope")
    with pytest.raises(PublishError, match="workflow name"):
        broker.workflow("")
    listed = await broker.workflows()
    assert [(w.name, w.steps, w.ended) for w in listed] == [("w", 2, 0)]


def test_the_headers_the_message_reads_are_the_workflows() -> None:
    from sqlmq import message

    assert (message._WORKFLOW_HEADER, message._STEP_HEADER) == (WORKFLOW_HEADER, STEP_HEADER)


@on_every_engine
async def test_a_handler_waits_for_a_signal_without_holding_a_worker(
    broker: Broker, db_url: str, prefix: str,
) -> None:
    from .conftest import sibling

    @broker.subscriber("refunds", results=True, workers=1, flush_interval=0.01)
    async def refund(msg: Message) -> str:
        if msg.state is None:
            return await msg.wait_for("approved", timeout=60, state="asked")
        signal = await msg.signal()
        assert signal is not None
        if signal.timed_out:
            return "timed out"
        return f"refunded {msg.body['amount']}, approved by {signal.payload['by']}"

    other = sibling(broker, db_url, prefix)  # another process's broker
    await broker.start()
    try:
        waits = await broker.publish("refunds", {"amount": 30})
        quick = await broker.publish("refunds", {"amount": 5})
        await wait_until(lambda: _deferred(broker, waits, quick), message="both waiting")
        # one worker, two waiting: neither holds it
        assert await other.signal(waits, "approved", {"by": "ann"})
        assert await broker.result(waits, timeout=20) == "refunded 30, approved by ann"
        assert await other.signal(quick, "approved", {"by": "bob"})
        assert await broker.result(quick, timeout=20) == "refunded 5, approved by bob"
        assert not await other.signal(waits, "approved", None)  # it ended
    finally:
        await broker.stop()
        if other.engine is not broker.engine:
            await other.close()


async def _deferred(broker: Broker, *ids: int) -> bool:
    from .conftest import rows

    found = {r["id"]: r for r in await rows(broker, "message")}
    return all(i in found and found[i]["defers_count"] == 1 for i in ids)
