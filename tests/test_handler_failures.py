"""A failing handler is logged once, with its traceback, saying what happens next; the
archive keeps the traceback (bounded). No worker task ends unseen: whatever goes wrong while
a message is handled, the worker logs it and carries on, and a delivery whose worker is gone
is given back rather than renewed for ever."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest

import sqlmq
from sqlmq import Broker, Message, Retry
from sqlmq.lifecycle import ABANDON_DELAY, TRACEBACK_LIMIT
from sqlmq.middleware import CallNext, Middleware

from .conftest import (
    archived,
    drained,
    on_every_engine,
    passes,
    rows,
    update_row,
    wait_until,
)

pytestmark = on_every_engine

FAST: dict[str, Any] = {"flush_interval": 0.01, "max_fetch_interval": 0.05, "workers": 1}


def _records(caplog: pytest.LogCaptureFixture, *words: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "sqlmq" and all(w in r.getMessage() for w in words)]


async def _given_back_and_due(broker: Broker, msg_id: int) -> None:
    """Wait until ``msg_id``, given back by the runtime (ready again after ABANDON_DELAY), is
    in the table or already archived again; then let that delay pass (on the in-memory
    engine by moving its clock)."""

    async def back() -> bool:
        return any(r["state"] == "PENDING" for r in await rows(broker, id=msg_id)) or bool(
            await rows(broker, "archive", id=msg_id))

    await wait_until(back, message=f"message {msg_id} given back")
    await passes(broker, ABANDON_DELAY)


def _raise_deep(depth: int) -> None:
    if depth == 0:
        raise ValueError("boom")
    _raise_deep(depth - 1)


async def test_a_failed_handler_is_logged_once_per_failure_with_its_traceback(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sqlmq")

    @broker.subscriber("q", retry=Retry.constant(0.01, max_attempts=2), **FAST)
    async def handle(msg: Message) -> None:
        _raise_deep(200)  # a long traceback: the archive keeps its end

    msg_id = await broker.publish("q", "x")
    await broker.start()
    try:
        row = await archived(broker, msg_id)
    finally:
        await broker.stop()

    retry = _records(caplog, f"message {msg_id} ", "queue q", "attempt 1", "retrying in")
    dead = _records(caplog, f"message {msg_id} ", "queue q", "attempt 2", "dead-lettered")
    assert [r.levelno for r in retry] == [logging.WARNING]
    assert [r.levelno for r in dead] == [logging.ERROR]
    assert "ValueError: boom" in retry[0].getMessage()
    for r in (*retry, *dead):
        assert r.exc_info is not None and r.exc_info[0] is ValueError
    assert len(_records(caplog, f"message {msg_id} ")) == 2  # once per failure

    assert row["state"] == "FAILED"
    first, _, trace = row["error"].partition("\n\n")
    assert first == "retries exhausted after 2 attempt(s): ValueError: boom"
    assert "Traceback (most recent call last)" in trace or trace.startswith("…")
    assert trace.endswith("ValueError: boom") and "_raise_deep" in trace
    assert len(trace) <= TRACEBACK_LIMIT + 1
    assert row["history"][-1]["error"] == first  # history keeps the one line


async def test_a_handler_raising_cancelled_error_fails_like_any_error(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    @broker.subscriber("q", retry=Retry.constant(0.01), **FAST)
    async def handle(msg: Message) -> None:
        calls.append(msg.id)
        if msg.attempts == 0 and msg.body == "cancel":
            raise asyncio.CancelledError()  # e.g. an inner task of the handler's, cancelled

    first = await broker.publish("q", "cancel")
    second = await broker.publish("q", "fine")
    await broker.start()
    try:
        await wait_until(lambda: drained(broker, "q"), message="both messages handled")
        (runtime,) = broker.runtimes
        assert all(not w.done() for w in runtime.workers.tasks)
    finally:
        await broker.stop()

    assert (await archived(broker, first))["state"] == "COMPLETED"
    assert (await archived(broker, second))["state"] == "COMPLETED"
    assert calls.count(first) == 2
    assert _records(caplog, f"message {first} ", "CancelledError", "retrying")


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() is broken too")


async def test_an_exception_whose_str_fails_does_not_kill_the_worker(broker: Broker) -> None:
    @broker.subscriber("q", retry=Retry.none(), **FAST)
    async def handle(msg: Message) -> None:
        if msg.body == "bad":
            raise BrokenStr()

    bad = await broker.publish("q", "bad")
    good = await broker.publish("q", "good")
    await broker.start()
    try:
        await wait_until(lambda: drained(broker, "q"), message="both messages settled")
    finally:
        await broker.stop()

    row = await archived(broker, bad)
    assert row["state"] == "FAILED"
    assert row["error"].startswith("retries exhausted after 1 attempt(s): BrokenStr: <str()")
    assert (await archived(broker, good))["state"] == "COMPLETED"


async def test_a_fault_of_the_runtime_is_logged_and_the_worker_carries_on(
    broker: Broker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in sqlmq itself while a message is handled (injected: the first completion
    raises) is logged with its traceback; the message is given back and runs again."""
    from sqlmq.lifecycle import Outcome
    from sqlmq.runtime import carried as carried_module  # a handled run's decide()

    faults: list[int] = []
    decide = carried_module.decide

    def faulty(d: Any, *args: Any, **kwargs: Any) -> Any:
        settlement = decide(d, *args, **kwargs)
        if not faults and settlement.outcome is Outcome.COMPLETE:
            faults.append(d.id)
            raise RuntimeError("injected fault")
        return settlement

    monkeypatch.setattr(carried_module, "decide", faulty)

    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        pass

    ids = [await broker.publish("q", i) for i in range(3)]
    await broker.start()
    try:
        await wait_until(lambda: faults, message="the injected fault")
        await _given_back_and_due(broker, faults[0])
        await wait_until(lambda: drained(broker, "q"), message="every message handled")
        (runtime,) = broker.runtimes
        assert all(not w.done() for w in runtime.workers.tasks)
    finally:
        await broker.stop()

    (faulted,) = faults
    for msg_id in ids:
        row = await archived(broker, msg_id)
        assert row["state"] == "COMPLETED"
        assert row["deliveries_count"] == (2 if msg_id == faulted else 1)
    (record,) = _records(caplog, f"message {faulted} ", "injected fault", "giving")
    assert record.levelno == logging.ERROR and record.exc_info is not None


async def test_a_worker_cancelled_from_outside_is_replaced_and_its_message_given_back(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    started = asyncio.Event()
    calls: list[int] = []

    @broker.subscriber("q", lease=3, **FAST)
    async def handle(msg: Message) -> None:
        calls.append(msg.id)
        if len(calls) == 1:
            started.set()
            await asyncio.sleep(3600)

    msg_id = await broker.publish("q", "x")
    await broker.start()
    try:
        await asyncio.wait_for(started.wait(), 20)
        (runtime,) = broker.runtimes
        (worker,) = runtime.workers.tasks
        worker.cancel()  # e.g. a library that cancels the wrong task
        await _given_back_and_due(broker, msg_id)
        row = await archived(broker, msg_id)
        assert runtime.workers.tasks[0] is not worker and not runtime.workers.tasks[0].done()
    finally:
        await broker.stop()

    assert row["state"] == "COMPLETED" and row["deliveries_count"] == 2
    assert calls == [msg_id, msg_id]
    assert _records(caplog, "ended unexpectedly", "cancelled")


async def test_reaching_max_deliveries_is_logged(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    @broker.subscriber("q", max_deliveries=3, **FAST)
    async def handle(msg: Message) -> None:
        pass

    msg_id = await broker.publish("q", "x")
    await update_row(broker, msg_id, deliveries_count=3)  # three that ended without a result
    await broker.start()
    try:
        row = await archived(broker, msg_id)
    finally:
        await broker.stop()

    assert row["state"] == "FAILED" and row["error"].startswith("max deliveries exceeded")
    (record,) = _records(caplog, f"message {msg_id} ", "dead-lettered", "max deliveries")
    assert record.levelno == logging.ERROR


async def test_max_deliveries_stops_a_poison_message_by_default(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    """A message that killed its process ten times (no result, so no retry strategy saw it)
    is not delivered for ever: the default limit archives it FAILED, with a log line."""
    from sqlmq.subscriber import SubscriberConfig

    assert SubscriberConfig(queues=("q",)).max_deliveries == 10
    assert SubscriberConfig(queues=("q",), retry=Retry.constant(
        1, max_attempts=20)).max_deliveries == 25  # never cuts a retry budget short
    assert SubscriberConfig(queues=("q",), max_deliveries=None).max_deliveries is None

    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        pass

    poison, fine = await broker.publish("q", "poison"), await broker.publish("q", "fine")
    await update_row(broker, poison, deliveries_count=10)
    await broker.start()
    try:
        await wait_until(lambda: drained(broker, "q"), message="both messages archived")
    finally:
        await broker.stop()

    row = await archived(broker, poison)
    assert (row["state"], row["error"]) == ("FAILED", "max deliveries exceeded (11 > 10)")
    assert (await archived(broker, fine))["state"] == "COMPLETED"
    assert _records(caplog, f"message {poison} ", "dead-lettered", "max deliveries")


# ---- whose frames a traceback shows -------------------------------------------------------

RUNTIME = str(Path(sqlmq.__file__).parent) + os.sep  # sqlmq's own files


def _frames(trace: str) -> list[str]:
    """The files of a formatted traceback's frames, outermost first (of its last exception:
    the one raised, after those it chains)."""
    last = trace.rsplit("Traceback (most recent call last):\n", 1)[-1]
    return re.findall(r'^  File "([^"]+)", line \d+, in ', last, re.MULTILINE)


def _archived_trace(row: Any) -> str:
    return row["error"].partition("\n\n")[2]


def _logged_trace(caplog: pytest.LogCaptureFixture, msg_id: int) -> str:
    (record,) = _records(caplog, f"message {msg_id} ", "dead-lettered")
    assert record.exc_info is not None
    return logging.Formatter().formatException(record.exc_info)


class Tenant(Middleware):
    async def handle(self, msg: Message, call_next: CallNext) -> Any:
        return await call_next(msg)


@pytest.mark.parametrize("around", ["nothing", "a middleware"])
async def test_a_handlers_traceback_starts_at_the_users_code(
    broker: Broker, caplog: pytest.LogCaptureFixture, around: str,
) -> None:
    """Neither the log nor the archive shows the runtime's frames before the user's code:
    the handler's, or their middleware's when one wraps it (and calls the handler through
    sqlmq, whose frames in between stay). A synchronous handler's hand-off to a thread is
    the runtime's too."""
    caplog.set_level(logging.WARNING, logger="sqlmq")
    if around == "a middleware":
        broker.add_middleware(Tenant())

    @broker.subscriber("q", retry=Retry.constant(0.01, max_attempts=1), **FAST)
    async def handle(msg: Message) -> None:
        raise ValueError("boom")

    @broker.subscriber("sync", retry=Retry.constant(0.01, max_attempts=1), **FAST)
    def handle_sync(msg: Message) -> None:
        raise ValueError("boom")

    ids = [await broker.publish("q", "x"), await broker.publish("sync", "x")]
    await broker.start()
    try:
        rows_ = [await archived(broker, msg_id) for msg_id in ids]
    finally:
        await broker.stop()

    for msg_id, row in zip(ids, rows_, strict=True):
        for trace in (_archived_trace(row), _logged_trace(caplog, msg_id)):
            frames = _frames(trace)
            assert frames[0] == __file__, trace
            assert frames[-1] == __file__ and trace.endswith("ValueError: boom"), trace
            if around == "nothing":
                assert not any(f.startswith(RUNTIME) for f in frames), trace
            else:  # no frame of the worker loop or the lease deadline
                assert not any(f.startswith(RUNTIME + "runtime" + os.sep) for f in frames), trace


async def test_an_error_of_sqlmq_keeps_sqlmqs_frames(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    """An error raised in sqlmq's code, not in the user's (here: the value a pipeline step
    returned cannot be encoded), keeps every frame: they are where it happened."""
    caplog.set_level(logging.WARNING, logger="sqlmq")

    @broker.subscriber("q", publish_to="next", retry=Retry.constant(0.01, max_attempts=1),
                       **FAST)
    async def handle(msg: Message) -> object:
        return object()

    msg_id = await broker.publish("q", "x")
    await broker.start()
    try:
        row = await archived(broker, msg_id)
    finally:
        await broker.stop()

    assert row["error"].startswith("retries exhausted after 1 attempt(s): PipelineError")
    for trace in (_archived_trace(row), _logged_trace(caplog, msg_id)):
        frames = _frames(trace)
        assert frames[0] == RUNTIME + os.path.join("runtime", "carried.py"), trace
        assert frames[-1] == RUNTIME + "pipeline.py", trace
