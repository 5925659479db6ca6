"""TestSqlmqBroker: users' unit tests of an sqlmq FastStream app in FastStream's style (no
database: handlers run inline, mocks record the calls), and ``with_real=True`` on a real
database; FastStream's OpenTelemetry and Prometheus middlewares on sqlmq."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from faststream import AckPolicy
from faststream.exceptions import SetupError
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from sqlmq.faststream import (
    SqlmqBroker,
    SqlmqMessage,
    SqlmqPrometheusMiddleware,
    SqlmqRouter,
    SqlmqTelemetryMiddleware,
    TestSqlmqBroker,
)

from ..conftest import drop_tables, wait_until


class Order(BaseModel):
    id: int
    total: float


def billing_app() -> tuple[SqlmqBroker, list[object], Any]:
    broker = SqlmqBroker("postgresql://app@db.invalid/app")  # never reached in unit tests
    decided: list[object] = []

    @broker.subscriber("orders")
    @broker.publisher("invoices")
    async def bill(order: Order) -> dict:
        if order.total < 0:
            raise ValueError("negative total")
        return {"order": order.id, "due": order.total * 2}

    @broker.subscriber("manual", ack_policy=AckPolicy.MANUAL)
    async def manual(body: str, msg: SqlmqMessage) -> None:
        await (msg.defer(30, state="later") if body == "later" else msg.reject("no"))
        decided.append(msg.raw_message.decision.kind)

    @broker.subscriber("steps", publish_to="done")
    async def step(body: int) -> int:
        return body + 1

    return broker, decided, bill


async def test_handlers_run_inline_with_no_database() -> None:
    broker, decided, bill = billing_app()
    (invoices,) = [p for p in broker.publishers if p.queue == "invoices"]
    async with TestSqlmqBroker(broker) as br:
        await br.publish({"id": 1, "total": 2.5}, "orders")
        bill.mock.assert_called_once_with({"id": 1, "total": 2.5})
        invoices.mock.assert_called_once_with({"order": 1, "due": 5.0})
        with pytest.raises(ValueError, match="negative total"):  # reaches the test
            await br.publish({"id": 2, "total": -1}, "orders")
        await br.publish("later", "manual")
        await br.publish("never", "manual")
        assert decided == ["defer", "reject"]
        await br.publish(1, "steps")  # a pipeline step's output is published onward
        done = next(p for p in broker.publishers if p.queue == "done")
        done.mock.assert_called_once_with(2)


async def test_routers_are_included_with_their_prefix() -> None:
    broker = SqlmqBroker("memory://")
    router = SqlmqRouter(prefix="billing.")

    @router.subscriber("orders")
    async def bill(order: Order) -> None:
        pass

    broker.include_router(router)
    async with TestSqlmqBroker(broker) as br:
        await br.publish({"id": 3, "total": 1}, "billing.orders")
        bill.mock.assert_called_once_with({"id": 3, "total": 1.0})


def test_sqlmq_alone_imports_no_faststream() -> None:
    code = ("import sys, sqlmq; sqlmq.Broker, sqlmq.Message; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'faststream'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"


def test_a_subscriber_needs_a_queue() -> None:
    broker = SqlmqBroker("memory://")
    with pytest.raises(SetupError):
        broker.subscriber()


async def test_with_real_runs_on_the_database(db_url: str, prefix: str) -> None:
    broker = SqlmqBroker(db_url, table_prefix=prefix, migrate=True)

    @broker.subscriber("orders")
    async def bill(order: Order) -> None:
        pass

    try:
        async with TestSqlmqBroker(broker, with_real=True) as br:
            await br.publish({"id": 4, "total": 1}, "orders")
            await bill.wait_call(timeout=20)
            bill.mock.assert_called_once_with({"id": 4, "total": 1})
    finally:
        drop_tables(db_url, prefix)


async def test_opentelemetry_and_prometheus_see_publishes_and_deliveries() -> None:
    spans = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(spans))
    registry = CollectorRegistry()
    broker = SqlmqBroker("memory://", middlewares=[
        SqlmqTelemetryMiddleware(tracer_provider=tracing),
        SqlmqPrometheusMiddleware(registry=registry)])
    seen: list[str] = []

    @broker.subscriber("orders")
    async def bill(order: Order, msg: SqlmqMessage) -> None:
        seen.append(msg.headers["traceparent"])

    await broker.start()
    try:
        await broker.publish({"id": 5, "total": 1}, "orders")
        await wait_until(lambda: len(spans.get_finished_spans()) >= 2,
                         message="the publish and process spans")
    finally:
        await broker.stop()
    finished = {s.name: s for s in spans.get_finished_spans()}
    assert {"orders publish", "orders process"} <= set(finished), sorted(finished)
    publish, process = finished["orders publish"], finished["orders process"]
    assert process.context.trace_id == publish.context.trace_id  # one trace, via headers
    assert publish.attributes["messaging.system"] == "sqlmq" and seen
    received = registry.get_sample_value(
        "faststream_received_messages_total",
        {"app_name": "faststream", "broker": "sqlmq", "handler": "orders"})
    published = registry.get_sample_value(
        "faststream_published_messages_total",
        {"app_name": "faststream", "broker": "sqlmq", "destination": "orders",
         "status": "success"})
    assert (received, published) == (1.0, 1.0)


async def test_request_runs_the_handler_inline_and_answers_with_its_result() -> None:
    from sqlmq import NoResult

    broker = SqlmqBroker("postgresql://app@db.invalid/app")  # never reached

    @broker.subscriber("quotes", results=True)
    async def quote(order: Order) -> dict[str, float]:
        return {"id": order.id, "due": order.total * 1.2}

    @broker.subscriber("plain")
    async def plain(order: Order) -> None:
        return None

    async with TestSqlmqBroker(broker) as br:
        response = await br.request(Order(id=7, total=10), "quotes")
        assert await response.decode() == {"id": 7, "due": 12.0}
        quote.mock.assert_called_once_with({"id": 7, "total": 10.0})
        with pytest.raises(NoResult, match="results=True"):
            await br.request({"id": 1, "total": 1}, "plain")
