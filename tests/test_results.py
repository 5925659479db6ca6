"""Results and request/reply end to end, on every database and the in-memory engine: a
subscriber with ``results=True`` keeps its handler's return value, ``result`` waits for a
message to end and answers with the value or the error that says how it ended, and
``request`` publishes and waits in one call (sqlmq.results). Across processes:
tests/faults/test_request_processes.py."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from sqlmq import (
    AWAITED_HEADER,
    Broker,
    ConfigurationError,
    Message,
    MessageCancelled,
    MessageExpired,
    MessageFailed,
    NoResult,
    ResultTimeout,
    Retry,
    UnknownMessage,
)

from .conftest import drained, on_every_engine, passes, rows, sibling, wait_until

pytestmark = on_every_engine


class Thumb(BaseModel):
    url: str
    width: int


def thumbs(broker: Broker, **options: Any) -> None:
    """A subscriber of ``thumbs`` that keeps its results: a thumbnail for a path, or the
    error its body asks for."""

    @broker.subscriber("thumbs", results=True, retry=Retry.none(), flush_interval=0.01,
                       **options)
    async def thumbnail(body: dict[str, Any]) -> Any:
        if "fail" in body:
            raise ValueError(body["fail"])
        if "returns" in body:
            return body["returns"]
        return Thumb(url=f"{body['path']}.thumb.png", width=128)


async def test_result_is_the_value_the_handler_returned(broker: Broker) -> None:
    thumbs(broker)
    await broker.start()
    ids = [await broker.publish("thumbs", body) for body in (
        {"path": "cat"}, {"returns": "text"}, {"returns": None}, {"returns": [1, 2.5]})]
    values = [await broker.result(i, timeout=20) for i in ids]
    assert values == [{"url": "cat.thumb.png", "width": 128}, "text", None, [1, 2.5]]
    # read again later, and at once: the archive keeps it
    assert await broker.result(ids[0], wait=False) == values[0]


async def test_request_publishes_with_the_awaited_header_and_returns_the_value(
        broker: Broker) -> None:
    seen: list[dict[str, str]] = []

    @broker.subscriber("echo", results=True, flush_interval=0.01)
    async def echo(msg: Message) -> bytes:
        seen.append(dict(msg.headers))
        return msg.payload[::-1]

    await broker.start()
    answers = await asyncio.gather(*(
        broker.request("echo", f"ping {i}".encode(), timeout=20, headers={"trace": str(i)})
        for i in range(10)))
    assert answers == [f"ping {i}".encode()[::-1] for i in range(10)]
    assert all(h[AWAITED_HEADER] == "result" and "trace" in h for h in seen)


async def test_each_ending_but_a_kept_result_raises_its_own_error(broker: Broker) -> None:
    thumbs(broker)
    await broker.start()
    with pytest.raises(MessageFailed) as failed:
        await broker.request("thumbs", {"fail": "not an image"}, timeout=20)
    assert failed.value.state == "FAILED"
    assert "ValueError: not an image" in str(failed.value)
    assert "Traceback" in (failed.value.error or "")  # the archived error, whole
    with pytest.raises(UnknownMessage):
        await broker.result(10**9, timeout=20)
    with pytest.raises(ResultTimeout) as late:
        await broker.result(await broker.publish("nobody", "x"), timeout=0.05)
    assert late.value.state == "PENDING"
    with pytest.raises(ResultTimeout, match="has not ended: it is PENDING"):
        await broker.result(late.value.msg_id, wait=False)


async def test_a_result_lives_as_long_as_its_archive_row(broker: Broker) -> None:
    thumbs(broker)
    await broker.start()
    msg_id = await broker.publish("thumbs", {"returns": "kept"})
    assert await broker.result(msg_id, timeout=20) == "kept"
    assert await broker.purge(ids=[msg_id]) == 1  # as retention deletes old rows
    with pytest.raises(UnknownMessage, match=f"no message {msg_id}"):
        await broker.result(msg_id, wait=False)


async def test_a_message_cancelled_while_a_caller_waits_raises_message_cancelled(
        broker: Broker) -> None:
    msg_id = await broker.publish("nobody", "x")
    waiting = asyncio.ensure_future(broker.result(msg_id, timeout=30))
    await wait_until(lambda: broker._results.waiting == 1, message="the caller waiting")
    assert (await broker.cancel(msg_id)).outcome == "cancelled"
    with pytest.raises(MessageCancelled):
        await waiting


async def test_a_running_message_cancelled_raises_message_cancelled(broker: Broker) -> None:
    started = asyncio.Event()

    @broker.subscriber("long", results=True, flush_interval=0.01)
    async def long(msg: Message) -> str:
        started.set()
        await wait_until(lambda: msg.cancel_requested, message="the cancel seen")
        raise RuntimeError("stopped early")

    await broker.start()
    request = asyncio.ensure_future(broker.request("long", "x", timeout=30))
    await asyncio.wait_for(started.wait(), 20)
    (msg_id,) = [r["id"] for r in await rows(broker, "message", queue="long")]
    assert (await broker.cancel(msg_id)).outcome == "requested"
    with pytest.raises(MessageCancelled):
        await request


async def test_a_message_taken_after_its_expiry_raises_message_expired(
        broker: Broker) -> None:
    past = datetime.now(UTC) - timedelta(hours=1)
    msg_id = await broker.publish("thumbs", {"path": "late"}, expires=past)
    waiting = asyncio.ensure_future(broker.result(msg_id, timeout=30))
    thumbs(broker)
    await broker.start()
    with pytest.raises(MessageExpired, match="expired at"):
        await waiting


async def test_a_completed_message_of_a_subscriber_without_results_raises_no_result(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    @broker.subscriber("plain", flush_interval=0.01)
    async def plain(body: str) -> str:
        return "not kept"

    await broker.start()
    with caplog.at_level(logging.WARNING, logger="sqlmq"):
        with pytest.raises(NoResult, match="results=True"):
            await broker.request("plain", "x", timeout=20)
    assert "keeps no results: register it with results=True" in caplog.text


@pytest.mark.parametrize("archive", ["failed", "none"])
async def test_results_need_an_archive_that_keeps_completed_messages(
        broker: Broker, archive: str) -> None:
    with pytest.raises(ConfigurationError, match=f"archive='{archive}' deletes completed"):
        broker.subscriber("thumbs", results=True, archive=archive)
    with pytest.raises(ConfigurationError, match="results must be True or False"):
        broker.subscriber("thumbs", results="yes")  # type: ignore[arg-type]


async def test_a_result_that_cannot_be_kept_fails_the_run(db_url: str, prefix: str) -> None:
    broker = Broker(db_url, table_prefix=prefix, max_payload_bytes=200)
    await broker.migrate()
    attempts: list[str] = []
    try:
        @broker.subscriber("big", results=True, flush_interval=0.01,
                           retry=Retry.constant(0.01, max_attempts=2))
        async def big(body: str) -> Any:
            attempts.append(body)
            return "x" * 500 if body == "large" else object()

        await broker.start()
        with pytest.raises(MessageFailed, match="over the limit of 200"):
            await broker.request("big", "large", timeout=20)
        with pytest.raises(MessageFailed, match="cannot be kept as the result"):
            await broker.request("big", "object", timeout=20)
        assert attempts == ["large"] * 2 + ["object"] * 2  # the retry strategy decided
    finally:
        from .conftest import drop_tables

        await broker.close()
        drop_tables(db_url, prefix)


async def test_a_pipeline_step_keeps_its_result_and_publishes_it_onward(
        broker: Broker) -> None:
    @broker.subscriber("orders", publish_to="invoices", results=True, flush_interval=0.01)
    async def bill(order: dict[str, int]) -> dict[str, int]:
        return {"order": order["id"], "total": order["total"] * 2}

    await broker.start()
    assert await broker.request("orders", {"id": 7, "total": 5}, timeout=20) == {
        "order": 7, "total": 10}
    (invoice,) = await rows(broker, "message", queue="invoices")
    assert invoice["payload"] == b'{"order":7,"total":10}'


async def test_a_deferred_message_has_no_result_until_a_run_completes(broker: Broker) -> None:
    deferred = asyncio.Event()

    @broker.subscriber("steps", results=True, flush_interval=0.01)
    async def step(msg: Message) -> Any:
        if msg.state is None:
            deferred.set()
            await msg.defer(delay=0.3, state={"done": 1})
            return "ignored: deferred"
        return {"steps": msg.state["done"] + 1}

    await broker.start()
    msg_id = await broker.publish("steps", "go")
    waiting = asyncio.ensure_future(broker.result(msg_id, timeout=30))
    await asyncio.wait_for(deferred.wait(), 20)
    await wait_until(lambda: _state(broker, msg_id, "PENDING"), message="deferred")
    with pytest.raises(ResultTimeout, match="it is PENDING"):
        await broker.result(msg_id, wait=False)
    await passes(broker, 0.4)
    assert await waiting == {"steps": 2}


async def test_a_requeued_dead_letter_answers_with_its_new_run(broker: Broker) -> None:
    broken = True

    @broker.subscriber("fragile", results=True, retry=Retry.none(), flush_interval=0.01)
    async def fragile(body: str) -> str:
        if broken:
            raise RuntimeError("the disk is full")
        return f"done: {body}"

    await broker.start()
    msg_id = await broker.publish("fragile", "x")
    with pytest.raises(MessageFailed, match="the disk is full"):
        await broker.result(msg_id, timeout=20)
    broken = False
    assert await broker.requeue(ids=[msg_id]) == 1
    assert await broker.result(msg_id, timeout=20) == "done: x"


@pytest.mark.parametrize("limits", [{"ordered": True}, {"max_concurrency": 1}])
async def test_requests_on_a_limited_channel_each_get_their_own_result(
        broker: Broker, limits: dict[str, Any]) -> None:
    order: list[int] = []

    @broker.subscriber("jobs", results=True, workers=4, flush_interval=0.01)
    async def job(body: int) -> int:
        order.append(body)
        return body * body

    await broker.set_channel("tenant", queue="jobs", **limits)
    await broker.start()
    ids = [await broker.publish("jobs", i, channel="tenant") for i in range(8)]
    assert await asyncio.gather(*(broker.result(i, timeout=30) for i in ids)) == [
        i * i for i in range(8)]
    if limits.get("ordered"):
        assert order == list(range(8))


async def test_a_caller_is_woken_by_another_brokers_settle(
        broker: Broker, db_url: str, prefix: str) -> None:
    """The subscriber runs on another broker, as another process would run it: the waiting
    caller hears of the ending through the database (NOTIFY, SQLite's commit counter,
    polling on MariaDB; the in-memory engine's commit counter), and does not poll tightly
    meanwhile."""
    worker = sibling(broker, db_url, prefix)
    release = asyncio.Event()

    @worker.subscriber("slow", results=True, flush_interval=0.01)
    async def slow(body: str) -> str:
        await release.wait()
        return body.upper()

    await worker.start()
    try:
        request = asyncio.ensure_future(broker.request("slow", "late", timeout=60))
        await wait_until(lambda: broker._results.waiting == 1, message="the caller waiting")
        await asyncio.sleep(1.0)  # the caller waits a while: how often does it read?
        reads = broker._results.reads
        release.set()
        assert await request == "LATE"
        # a tight poll would have read hundreds of times; the slowest (MariaDB's, a quarter
        # of the wait) reads a few dozen
        assert reads < 60, f"{reads} reads in a second of waiting"
    finally:
        release.set()
        await worker.close()


async def test_a_fresh_message_that_ended_before_its_caller_waits_is_read_at_once(
        broker: Broker, db_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``request`` waits for a message it has just published without reading first where
    push notices come (PostgreSQL): the notice will say when it ended. Unless the notice
    came already, while the publish was being confirmed: then it reads at once, rather
    than at the safety poll (made a minute here, longer than the test waits)."""
    from sqlmq import Outcome, Settlement
    from sqlmq.codec import encode_state
    from sqlmq.results import watch

    monkeypatch.setattr(watch, "SAFETY_POLL", 60.0)
    results = broker._results
    with pytest.raises(TimeoutError):  # starts the watch, and its listener where there is one
        await results.wait(await broker.publish("nobody", 1), 0.01)
    if db_kind == "postgresql":
        await wait_until(results._pushes, message="the result listener connected")
    with pytest.raises(TimeoutError):  # reads once more: what the connect told is old news
        await results.wait(await broker.publish("nobody", 2), 0.1)
    msg_id = await broker.publish("q", "x")
    (d,) = await broker.engine.acquire(["q"], 1, 30)  # as another process would
    await broker.engine.settle([Settlement(d.id, 1, Outcome.COMPLETE, answers=True,
                                           result=encode_state("early"))])
    if db_kind == "postgresql":  # its NOTIFY heard before anyone waits
        await wait_until(lambda: msg_id in results._recent, message="the notice heard")
    else:
        results.ended([msg_id])  # as this process's settle tells it
    answer = await results.wait(msg_id, 30, fresh=True)
    assert answer is not None and answer.state == "COMPLETED"


async def test_the_sync_twins_answer_code_without_an_event_loop(broker: Broker) -> None:
    thumbs(broker)
    await broker.start()
    assert await asyncio.to_thread(broker.request_sync, "thumbs", {"returns": "sync"},
                                   timeout=20) == "sync"
    msg_id = await broker.publish("thumbs", {"fail": "no"})
    with pytest.raises(MessageFailed, match="no"):
        await asyncio.to_thread(broker.result_sync, msg_id, timeout=20)
    with pytest.raises(ResultTimeout):
        await asyncio.to_thread(broker.result_sync, await broker.publish("nobody", 1),
                                timeout=0.05)
    with pytest.raises(ConfigurationError, match=r"await broker\.result\(\)"):
        broker.result_sync(msg_id)  # on the loop's own thread it would block the handlers


async def test_bad_arguments_are_refused_naming_the_problem(broker: Broker) -> None:
    with pytest.raises(ConfigurationError, match="a message id is an int"):
        await broker.result("7")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="timeout must be seconds"):
        await broker.result(7, timeout=-1)
    with pytest.raises(ConfigurationError, match="headers must be a mapping"):
        await broker.request("q", "x", headers=["a"])  # type: ignore[arg-type]
    assert await drained(broker, "q")  # nothing was published


async def _state(broker: Broker, msg_id: int, state: str) -> bool:
    view = await broker.insights().message(msg_id)
    return view is not None and view.state == state
