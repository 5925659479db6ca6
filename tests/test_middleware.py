"""Middleware (sqlmq.middleware): a user's hooks around publish and handle, and the
runtime's observation points, on every engine. Every publish path goes through the publish
hook (a header it adds reaches the consumer), the handle hook wraps each delivery and sees
its outcome, several middlewares nest in registration order, and a middleware that raises
is reported naming it and loses no message."""

from __future__ import annotations

import asyncio
import logging
from contextlib import contextmanager
from typing import Any

import pytest

from sqlmq import (
    Broker,
    CallNext,
    CallNextBatch,
    ConfigurationError,
    Message,
    Middleware,
    MiddlewareError,
    Outcome,
    PublishBatch,
    Retry,
    Settled,
)

from .conftest import on_every_engine, rows, wait_until

FAST: dict[str, Any] = {"flush_interval": 0.01, "max_fetch_interval": 0.05}


class Recorder(Middleware):
    """Adds ``x-by`` to every publish and records what each hook saw."""

    def __init__(self, name: str = "r", log: list[str] | None = None) -> None:
        self.name = name
        self.log = log if log is not None else []
        self.batches: list[PublishBatch] = []
        self.handled: list[tuple[int, str, int, str]] = []  # id, queue, delivery, outcome
        self.settled_events: list[Settled] = []
        self.fetched_total = 0
        self.flushed_total = 0

    def publish(self, batch: PublishBatch) -> Any:
        self.batches.append(batch)
        batch.set_header("x-by", self.name)
        return self._around(batch)

    @contextmanager
    def _around(self, batch: PublishBatch) -> Any:
        self.log.append(f"{self.name} publish enter")
        yield
        self.log.append(f"{self.name} publish exit {list(batch.ids or [])}")

    async def handle(self, msg: Message, call_next: CallNext) -> Any:
        self.log.append(f"{self.name} handle enter")
        assert msg.created_at is not None and msg.deliveries >= 1
        try:
            result = await call_next(msg)
        except Exception as exc:
            self.handled.append((msg.id, msg.queue, msg.deliveries, f"raised {exc}"))
            self.log.append(f"{self.name} handle raised")
            raise
        self.handled.append((msg.id, msg.queue, msg.deliveries, "ok"))
        self.log.append(f"{self.name} handle exit")
        return result

    def settled(self, event: Settled) -> None:
        self.settled_events.append(event)

    def fetched(self, queues: Any, got: int, asked: int) -> None:
        assert 0 <= got <= asked
        self.fetched_total += got

    def flushed(self, queues: Any, size: int, limit: int, seconds: float) -> None:
        assert 0 < size <= limit and seconds >= 0
        self.flushed_total += size


@on_every_engine
async def test_every_publish_path_goes_through_the_hook_and_the_header_reaches_the_consumer(
    broker: Broker,
) -> None:
    recorder = Recorder()
    broker.add_middleware(recorder)
    seen: dict[str, str | None] = {}

    @broker.subscriber(["q", "r"], **FAST)
    async def handle(msg: Message) -> None:
        seen[msg.body] = msg.headers.get("x-by")

    @broker.subscriber(topic="orders.*", group="g", **FAST)
    async def on_topic(msg: Message) -> None:
        seen[msg.body] = msg.headers.get("x-by")

    await broker.start()
    try:
        one = await broker.publish("q", "one", headers={"keep": "me"})
        many = await broker.publish_batch("q", ["b1", "b2", b"raw"])
        sync_one = await asyncio.to_thread(broker.publish_sync, "r", "sync")
        await asyncio.to_thread(broker.publish_batch_sync, "r", ["sync-b1", "sync-b2"])
        await broker.publish_topic("orders.created", "topic")
        await asyncio.to_thread(broker.publish_topic_sync, "orders.paid", "topic-sync")
        await wait_until(lambda: len(seen) == 9, message="every message handled")
    finally:
        await broker.stop()

    assert seen == dict.fromkeys(["one", "b1", "b2", b"raw", "sync", "sync-b1", "sync-b2",
                                  "topic", "topic-sync"], "r")
    assert [(b.destination, b.queue, b.topic, len(b)) for b in recorder.batches] == [
        ("q", "q", None, 1), ("q", "q", None, 3), ("r", "r", None, 1), ("r", "r", None, 2),
        ("orders.created", None, "orders.created", 1), ("orders.paid", None, "orders.paid", 1)]
    assert [list(b.ids or []) for b in recorder.batches[:3]] == [[one], many, [sync_one]]
    assert all(b.ids and len(b.ids) == 1 for b in recorder.batches[4:])  # one copy: one group
    archived = {r["id"]: r["headers"] for r in await rows(broker, "archive")}
    assert archived[one]["keep"] == "me" and archived[one]["x-by"] == "r"


async def test_a_publish_in_the_callers_transaction_goes_through_the_hook(
    broker: Broker,
) -> None:
    recorder = Recorder()
    broker.add_middleware(recorder)
    async with broker.db.begin() as conn:
        committed = await broker.publish("q", "committed", connection=conn)
    async with broker.db.connect() as conn:
        await broker.publish("q", "rolled back", connection=conn)
        await conn.rollback()

    assert [b.connection is not None for b in recorder.batches] == [True, True]
    (row,) = await rows(broker)
    assert row["id"] == committed and row["headers"]["x-by"] == "r"


@on_every_engine
async def test_handle_sees_success_and_failure_and_settlements_are_observed(
    broker: Broker,
) -> None:
    recorder = Recorder()
    broker.add_middleware(recorder)

    @broker.subscriber("q", retry=Retry.constant(0, max_attempts=2), **FAST)
    async def handle(msg: Message) -> None:
        if msg.body == "bad" or (msg.body == "flaky" and msg.deliveries == 1):
            raise ValueError(msg.body)

    ok = await broker.publish("q", "ok")
    flaky = await broker.publish("q", "flaky")
    bad = await broker.publish("q", "bad")
    await broker.start()
    try:
        await wait_until(lambda: len(recorder.settled_events) == 5, message="5 results")
    finally:
        await broker.stop()

    assert sorted(recorder.handled) == sorted([
        (ok, "q", 1, "ok"), (flaky, "q", 1, "raised flaky"), (flaky, "q", 2, "ok"),
        (bad, "q", 1, "raised bad"), (bad, "q", 2, "raised bad")])
    outcomes = sorted((e.settlement.id, e.settlement.deliveries, e.outcome, e.stale,
                       e.queue) for e in recorder.settled_events)
    assert outcomes == sorted([
        (ok, 1, Outcome.COMPLETE, False, "q"), (flaky, 1, Outcome.RETRY, False, "q"),
        (flaky, 2, Outcome.COMPLETE, False, "q"), (bad, 1, Outcome.RETRY, False, "q"),
        (bad, 2, Outcome.FAIL, False, "q")])
    assert all(e.created_at is not None for e in recorder.settled_events)
    assert recorder.flushed_total == 5
    assert recorder.fetched_total <= 5  # the rest may have been handed over at publish


@on_every_engine
async def test_several_middlewares_nest_in_registration_order(broker: Broker) -> None:
    log: list[str] = []
    outer, inner = Recorder("outer", log), Recorder("inner", log)
    broker.add_middleware(inner)
    broker.add_middleware(outer, first=True)
    assert broker.middleware == [outer, inner]
    done = asyncio.Event()

    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        log.append(f"handler sees x-by={msg.headers['x-by']}")
        done.set()

    msg_id = await broker.publish("q", "x")
    await broker.start()
    try:
        await asyncio.wait_for(done.wait(), 20)
        await wait_until(lambda: len(outer.settled_events) == len(inner.settled_events) == 1,
                         message="the result observed by both")
    finally:
        await broker.stop()

    assert log == [
        "outer publish enter", "inner publish enter",
        f"inner publish exit {[msg_id]}", f"outer publish exit {[msg_id]}",
        "outer handle enter", "inner handle enter",
        "handler sees x-by=inner",  # the inner one's publish hook ran last
        "inner handle exit", "outer handle exit"]


@on_every_engine
async def test_a_middleware_that_raises_in_handle_is_named_and_loses_nothing(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sqlmq")

    class Broken(Middleware):
        async def handle(self, msg: Message, call_next: CallNext) -> Any:
            if msg.deliveries == 1:
                raise RuntimeError("middleware bug")
            return await call_next(msg)

    broker.add_middleware(Broken())
    handled: list[int] = []

    @broker.subscriber("q", retry=Retry.constant(0, max_attempts=3), **FAST)
    async def handle(msg: Message) -> None:
        handled.append(msg.deliveries)

    msg_id = await broker.publish("q", "x")
    await broker.start()
    try:
        await wait_until(lambda: handled == [2], message="the second delivery handled")
        await wait_until(lambda: rows(broker, "archive", id=msg_id), message="archived")
    finally:
        await broker.stop()

    (row,) = await rows(broker, "archive", id=msg_id)
    assert row["state"] == "COMPLETED" and row["deliveries_count"] == 2
    named = [r for r in caplog.records if "middleware Broken raised RuntimeError: middleware "
             "bug in handle() for message" in r.getMessage()]
    assert len(named) == 1 and named[0].levelno == logging.ERROR
    retried = [r for r in caplog.records if f"message {msg_id} " in r.getMessage()
               and "retrying" in r.getMessage()]
    assert len(retried) == 1 and retried[0].exc_info is not None
    assert "raised by sqlmq middleware" in "".join(retried[0].exc_info[1].__notes__)


@on_every_engine
async def test_a_middleware_that_raises_in_publish_fails_the_publish_and_names_itself(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    class Refuses(Middleware):
        def publish(self, batch: PublishBatch) -> None:
            if batch.payloads[0] == b"refused":
                raise ValueError("not this one")

    class BrokenExit(Middleware):
        def publish(self, batch: PublishBatch) -> Any:
            return self._after(batch)

        @contextmanager
        def _after(self, batch: PublishBatch) -> Any:
            yield
            if batch.payloads[0] == b"written":
                raise RuntimeError("bug after the write")

    broker.add_middleware(Refuses())
    broker.add_middleware(BrokenExit())
    with pytest.raises(MiddlewareError, match=r"middleware Refuses failed before "
                       r"publishing to 'q': ValueError: not this one; nothing was published"):
        await broker.publish("q", "refused")
    with pytest.raises(MiddlewareError):
        await asyncio.to_thread(broker.publish_sync, "q", "refused")
    msg_id = await broker.publish("q", "written")  # the exit's fault is logged, not raised

    assert [r["id"] for r in await rows(broker)] == [msg_id]
    assert any("BrokenExit failed after publishing to 'q' (it was published): RuntimeError"
               in r.getMessage() for r in caplog.records)


@on_every_engine
async def test_a_failing_observer_is_logged_and_the_runtime_goes_on(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    class BadObserver(Middleware):
        def settled(self, event: Settled) -> None:
            raise RuntimeError("observer bug")

    broker.add_middleware(BadObserver())
    done: list[int] = []

    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        done.append(msg.id)

    await broker.publish_batch("q", ["a", "b", "c"])
    await broker.start()
    try:
        await wait_until(lambda: len(done) == 3, message="3 handled")
        await wait_until(lambda: _count(broker, 3), message="3 archived")
    finally:
        await broker.stop()
    assert any("BadObserver failed in settled(): RuntimeError: observer bug" in r.getMessage()
               for r in caplog.records)


async def _count(broker: Broker, n: int) -> bool:
    return len(await rows(broker, "archive", state="COMPLETED")) == n


@on_every_engine
async def test_a_pipeline_output_goes_through_the_publish_hook(broker: Broker) -> None:
    recorder = Recorder()
    broker.add_middleware(recorder)
    seen: list[tuple[Any, str | None]] = []

    @broker.subscriber("orders", publish_to="invoices", **FAST)
    async def bill(order: dict[str, Any]) -> dict[str, Any]:
        return {"invoice": order["id"]}

    @broker.subscriber("invoices", **FAST)
    async def record(msg: Message) -> None:
        seen.append((msg.body, msg.headers.get("x-by")))

    order = await broker.publish("orders", {"id": 7})
    await broker.start()
    try:
        await wait_until(lambda: len(seen) == 1, message="the invoice handled")
    finally:
        await broker.stop()

    assert seen == [({"invoice": 7}, "r")]
    output = recorder.batches[1]
    assert output.destination == "invoices" and output.cause is not None
    assert output.cause.id == order and output.ids is None  # written with the input's result


@on_every_engine
async def test_without_middleware_the_handler_is_called_directly(broker: Broker) -> None:
    class OnlyObserves(Middleware):
        def settled(self, event: Settled) -> None:
            pass

    broker.add_middleware(OnlyObserves())

    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        pass

    await broker.start()
    try:
        (runtime,) = broker.runtimes
        # no handle hook: the worker calls the adapter itself, the publish path checks an
        # empty list, and only the settle observation has a listener
        assert runtime.workers._call is runtime.adapter
        assert broker._hooks.publish == [] and broker._hooks.handle == []
        assert len(broker._hooks.settle) == 1 and broker._hooks.fetch == []
        with pytest.raises(ConfigurationError, match="before start"):
            broker.add_middleware(Middleware())
    finally:
        await broker.stop()


async def test_set_header_checks_what_it_sets() -> None:
    broker = Broker("memory://")

    class Bad(Middleware):
        def publish(self, batch: PublishBatch) -> None:
            batch.set_header("x", 1)  # type: ignore[arg-type]

    broker.add_middleware(Bad())
    with pytest.raises(MiddlewareError, match="header 'x' must be a string, got int"):
        await broker.publish("q", "x")
    await broker.close()


@on_every_engine
async def test_a_publish_hook_failing_on_a_pipeline_output_retries_the_step(
    broker: Broker,
) -> None:
    class FailsOnce(Middleware):
        failed = False

        def publish(self, batch: PublishBatch) -> None:
            if batch.cause is not None and not self.failed:
                self.failed = True
                raise RuntimeError("hook bug")

    broker.add_middleware(FailsOnce())
    invoices: list[Any] = []

    @broker.subscriber("orders", publish_to="invoices",
                       retry=Retry.constant(0, max_attempts=3), **FAST)
    async def bill(order: dict[str, Any]) -> dict[str, Any]:
        return {"invoice": order["id"]}

    @broker.subscriber("invoices", **FAST)
    async def record(invoice: dict[str, Any]) -> None:
        invoices.append(invoice)

    order = await broker.publish("orders", {"id": 3})
    await broker.start()
    try:
        await wait_until(lambda: invoices == [{"invoice": 3}], message="the invoice")
        await wait_until(lambda: rows(broker, "archive", id=order), message="order archived")
    finally:
        await broker.stop()
    (row,) = await rows(broker, "archive", id=order)
    assert (row["state"], row["deliveries_count"]) == ("COMPLETED", 2)
    assert len(await rows(broker, "archive", queue="invoices")) == 1


class BatchRecorder(Middleware):
    """Records each batch call it wraps: the messages' bodies and what came back."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log
        self.calls: list[tuple[list[Any], Any]] = []

    async def handle_batch(self, msgs: list[Message], call_next: CallNextBatch) -> Any:
        self.log.append(f"{self.name} enter {len(msgs)}")
        try:
            result = await call_next(msgs)
        except Exception as exc:
            self.calls.append(([m.body for m in msgs], f"raised {exc}"))
            self.log.append(f"{self.name} raised")
            raise
        self.calls.append(([m.body for m in msgs], result))
        self.log.append(f"{self.name} exit")
        return result


class OneAtATime(Middleware):
    """Wraps single deliveries only."""

    def __init__(self) -> None:
        self.handled = 0

    async def handle(self, msg: Message, call_next: CallNext) -> Any:
        self.handled += 1
        return await call_next(msg)


@on_every_engine
async def test_handle_batch_wraps_each_batch_call_in_order_and_handle_does_not(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sqlmq")
    order: list[str] = []
    outer, inner, single = BatchRecorder("outer", order), BatchRecorder("inner", order), \
        OneAtATime()
    for m in (outer, single, inner):
        broker.add_middleware(m)

    @broker.subscriber("rows", batch=3, batch_wait=5.0, workers=1, results=True,
                       retry=Retry.none(), **FAST)
    async def doubled(numbers: list[int]) -> list[int]:
        order.append(f"handler {len(numbers)}")
        if 0 in numbers:
            raise ValueError("no zeros")
        return [n * 2 for n in numbers]

    await broker.publish_batch("rows", [1, 2, 3])
    await broker.start()
    try:
        await wait_until(lambda: len(outer.calls) == 1, message="the first batch")
        await broker.publish_batch("rows", [0, 4, 5])
        await wait_until(lambda: len(outer.calls) == 2, message="the second batch")
    finally:
        await broker.stop()

    assert outer.calls == inner.calls == [([1, 2, 3], [2, 4, 6]),
                                          ([0, 4, 5], "raised no zeros")]
    assert order == ["outer enter 3", "inner enter 3", "handler 3", "inner exit",
                     "outer exit", "outer enter 3", "inner enter 3", "handler 3",
                     "inner raised", "outer raised"]
    assert single.handled == 0
    warned = [r.getMessage() for r in caplog.records if "is a batch handler" in r.getMessage()]
    assert len(warned) == 1 and "middleware OneAtATime wraps the handling of one message" \
        in warned[0]


@on_every_engine
async def test_a_handle_batch_hook_that_raises_fails_each_message_and_is_named(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sqlmq")

    class Broken(Middleware):
        async def handle_batch(self, msgs: list[Message], call_next: CallNextBatch) -> Any:
            if msgs[0].deliveries == 1:
                raise RuntimeError("middleware bug")
            return await call_next(msgs)

    broker.add_middleware(Broken())
    handled: list[list[int]] = []

    @broker.subscriber("rows", batch=2, batch_wait=5.0, retry=Retry.constant(0, max_attempts=3),
                       **FAST)
    async def load(msgs: list[Message]) -> None:
        handled.append([m.deliveries for m in msgs])

    ids = await broker.publish_batch("rows", ["a", "b"])
    await broker.start()
    try:
        await wait_until(lambda: handled == [[2, 2]], message="the second deliveries handled")
        await wait_until(lambda: _all_archived(broker, ids), message="both archived")
    finally:
        await broker.stop()

    archived = await rows(broker, "archive")
    assert {(r["state"], r["deliveries_count"]) for r in archived} == {("COMPLETED", 2)}
    named = [r for r in caplog.records if "middleware Broken raised RuntimeError: middleware "
             "bug in handle_batch() for a batch of 2 messages of rows" in r.getMessage()]
    assert len(named) == 1 and named[0].levelno == logging.ERROR
    failed = [r for r in caplog.records if "batch handler" in r.getMessage()
              and "failed on 2 messages" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert "raised by sqlmq middleware Broken.handle_batch()" in "".join(
        failed[0].exc_info[1].__notes__)


async def _all_archived(broker: Broker, ids: list[int]) -> bool:
    return len(await rows(broker, "archive")) == len(ids)
