"""OpenTelemetry tracing (sqlmq.tracing), with the SDK's in-memory exporter and a
TracerProvider of the test's own: a publish's PRODUCER span and the CONSUMER span of its
handling are one trace, the consumer a child of the producer, through the message's headers;
on every engine, and through the outbox (a publish in the caller's transaction) and a
pipeline on the databases."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy.ext.asyncio import AsyncSession

from sqlmq import Broker, Message, Retry, TracingMiddleware
from sqlmq.tracing import trace_headers

from .conftest import on_every_engine, sibling, wait_until

FAST: dict[str, Any] = {"flush_interval": 0.01, "max_fetch_interval": 0.05}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()  # the test's own: the global provider is never set
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def spans(exporter: InMemorySpanExporter, kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is kind]


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    assert span.context is not None and parent.context is not None
    return (span.context.trace_id == parent.context.trace_id and span.parent is not None
            and span.parent.span_id == parent.context.span_id)


@on_every_engine
async def test_the_consumer_span_is_a_child_of_the_producer_span(
    broker: Broker, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    broker.add_middleware(TracingMiddleware(tracer_provider=provider))
    headers: list[dict[str, str]] = []

    @broker.subscriber("orders", retry=Retry.constant(0, max_attempts=2), **FAST)
    async def handle(msg: Message) -> None:
        headers.append(dict(msg.headers))
        if msg.body == "flaky" and msg.deliveries == 1:
            raise ValueError("first time")

    await broker.start()
    try:
        ok = await broker.publish("orders", "ok")
        flaky = await broker.publish("orders", "flaky")
        await wait_until(lambda: len(spans(exporter, SpanKind.CONSUMER)) == 3,
                         message="3 consumer spans")
    finally:
        await broker.stop()

    producers = {p.attributes["messaging.message.id"]: p
                 for p in spans(exporter, SpanKind.PRODUCER)}
    assert sorted(producers) == sorted([str(ok), str(flaky)])
    for p in producers.values():
        assert p.name == "publish orders"
        assert p.attributes["messaging.system"] == "sqlmq"
        assert p.attributes["messaging.destination.name"] == "orders"
        assert p.parent is None  # nothing was current: a new trace
    assert all("traceparent" in h for h in headers)
    consumers = spans(exporter, SpanKind.CONSUMER)
    for c in consumers:
        msg_id = c.attributes["messaging.message.id"]
        assert c.name == "process orders"
        assert c.attributes["messaging.system"] == "sqlmq"
        assert c.attributes["messaging.destination.name"] == "orders"
        assert child_of(c, producers[msg_id])
    by_delivery = sorted((c.attributes["messaging.message.id"],
                          c.attributes["messaging.sqlmq.message.delivery_count"],
                          c.status.status_code) for c in consumers)
    assert by_delivery == sorted([(str(ok), 1, StatusCode.UNSET),
                                  (str(flaky), 1, StatusCode.ERROR),
                                  (str(flaky), 2, StatusCode.UNSET)])
    (failed,) = [c for c in consumers if c.status.status_code is StatusCode.ERROR]
    assert [e.name for e in failed.events] == ["exception"]
    assert failed.events[0].attributes["exception.type"] == "ValueError"


@on_every_engine
async def test_a_batch_is_one_producer_span_and_a_publish_joins_the_current_trace(
    broker: Broker, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    broker.add_middleware(TracingMiddleware(tracer_provider=provider))

    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        pass

    await broker.start()
    try:
        with provider.get_tracer("app").start_as_current_span("request") as request:
            await broker.publish_batch("q", ["a", "b", "c"])
        await wait_until(lambda: len(spans(exporter, SpanKind.CONSUMER)) == 3,
                         message="3 consumer spans")
    finally:
        await broker.stop()

    (producer,) = spans(exporter, SpanKind.PRODUCER)
    (app,) = [s for s in exporter.get_finished_spans() if s.name == "request"]
    assert child_of(producer, app) and app.context.span_id == request.get_span_context().span_id
    assert producer.attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in producer.attributes
    assert all(child_of(c, producer) for c in spans(exporter, SpanKind.CONSUMER))


async def test_through_the_outbox_the_trace_goes_on(
    broker: Broker, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    broker.add_middleware(TracingMiddleware(tracer_provider=provider))

    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        pass

    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("create order"):
        async with broker.db.begin() as conn:  # the caller's transaction
            in_connection = await broker.publish("q", "on a connection", connection=conn)
        async with AsyncSession(broker.db) as session, session.begin():
            in_session = await broker.publish("q", "in a session", connection=session)
    await broker.start()
    try:
        await wait_until(lambda: len(spans(exporter, SpanKind.CONSUMER)) == 2,
                         message="2 consumer spans")
    finally:
        await broker.stop()

    (app,) = [s for s in exporter.get_finished_spans() if s.name == "create order"]
    producers = {p.attributes["messaging.message.id"]: p
                 for p in spans(exporter, SpanKind.PRODUCER)}
    assert sorted(producers) == sorted([str(in_connection), str(in_session)])
    assert all(child_of(p, app) for p in producers.values())
    for c in spans(exporter, SpanKind.CONSUMER):
        assert child_of(c, producers[c.attributes["messaging.message.id"]])


@on_every_engine
async def test_a_pipeline_is_one_trace(
    broker: Broker, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    broker.add_middleware(TracingMiddleware(tracer_provider=provider))

    @broker.subscriber("orders", publish_to="invoices", **FAST)
    async def bill(order: dict[str, Any]) -> dict[str, Any]:
        return {"invoice": order["id"]}

    @broker.subscriber("invoices", **FAST)
    async def record(invoice: dict[str, Any]) -> None:
        pass

    await broker.publish("orders", {"id": 1})
    await broker.start()
    try:
        await wait_until(lambda: len(spans(exporter, SpanKind.CONSUMER)) == 2,
                         message="both steps' consumer spans")
    finally:
        await broker.stop()

    producers = {p.name: p for p in spans(exporter, SpanKind.PRODUCER)}
    consumers = {c.name: c for c in spans(exporter, SpanKind.CONSUMER)}
    assert set(producers) == {"publish orders", "publish invoices"}
    assert set(consumers) == {"process orders", "process invoices"}
    assert child_of(consumers["process orders"], producers["publish orders"])
    assert child_of(producers["publish invoices"], consumers["process orders"])
    assert child_of(consumers["process invoices"], producers["publish invoices"])


@on_every_engine
async def test_a_batch_call_is_one_consumer_span_linked_to_its_producers(
    broker: Broker, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    broker.add_middleware(TracingMiddleware(tracer_provider=provider))
    batches: list[list[int]] = []

    @broker.subscriber("q", batch=3, batch_wait=5.0, workers=1, **FAST)
    async def load(msgs: list[Message]) -> None:
        batches.append([m.id for m in msgs])

    together = await broker.publish_batch("q", ["a", "b", "c"])  # one producer span
    apart = [await broker.publish("q", body) for body in ("d", "e", "f")]  # three
    await broker.start()
    try:
        await wait_until(lambda: len(spans(exporter, SpanKind.CONSUMER)) == 2,
                         message="a consumer span per batch")
    finally:
        await broker.stop()

    assert batches == [together, apart]
    producers = spans(exporter, SpanKind.PRODUCER)
    batch_producer = next(p for p in producers if p.attributes.get(
        "messaging.batch.message_count") == 3)
    singles = {p.context.span_id for p in producers if p is not batch_producer}
    first, second = sorted(spans(exporter, SpanKind.CONSUMER), key=lambda c: c.start_time)
    for consumer, ids in ((first, together), (second, apart)):
        assert consumer.name == "process q"
        assert consumer.attributes["messaging.batch.message_count"] == 3
        assert list(consumer.attributes["messaging.sqlmq.message.ids"]) == [str(i) for i in ids]
        assert consumer.attributes["messaging.destination.name"] == "q"
    # one producer: it is the parent (one trace), and the one link counts its messages
    assert child_of(first, batch_producer)
    (link,) = first.links
    assert link.context.span_id == batch_producer.context.span_id
    assert link.attributes["messaging.batch.message_count"] == 3
    # several producers: a trace of its own, linked to each
    assert second.parent is None
    assert {link.context.span_id for link in second.links} == singles
    assert all(link.attributes["messaging.batch.message_count"] == 1 for link in second.links)


@on_every_engine
async def test_a_batch_of_several_queues_names_them_all(
    broker: Broker, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    broker.add_middleware(TracingMiddleware(tracer_provider=provider))
    batches: list[list[str]] = []

    @broker.subscriber(["a", "b"], batch=2, batch_wait=5.0, workers=1, **FAST)
    async def load(msgs: list[Message]) -> None:
        batches.append(sorted(m.queue for m in msgs))

    await broker.publish("a", "x")
    await broker.publish("b", "y")
    await broker.start()
    try:
        await wait_until(lambda: len(spans(exporter, SpanKind.CONSUMER)) == 1,
                         message="the batch's span")
    finally:
        await broker.stop()

    assert batches == [["a", "b"]]
    (consumer,) = spans(exporter, SpanKind.CONSUMER)
    assert consumer.name == "process a,b"
    assert "messaging.destination.name" not in consumer.attributes
    assert len(consumer.links) == 2 and consumer.parent is None


@on_every_engine
async def test_a_failed_batch_leaves_the_error_on_its_span_and_a_batch_pipeline_is_one_trace(
    broker: Broker, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    broker.add_middleware(TracingMiddleware(tracer_provider=provider))

    @broker.subscriber("orders", batch=2, batch_wait=5.0, publish_to="invoices",
                       retry=Retry.none(), **FAST)
    async def bill(orders: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if any("bad" in o for o in orders):
            raise ValueError("bad order")
        return [{"invoice": o["id"]} for o in orders]

    await broker.publish_batch("orders", [{"id": 1}, {"id": 2}])
    await broker.start()
    try:
        await wait_until(lambda: len(spans(exporter, SpanKind.PRODUCER)) == 2,
                         message="the output's producer span")
        await broker.publish_batch("orders", [{"bad": 1}, {"bad": 2}])
        await wait_until(lambda: len(spans(exporter, SpanKind.CONSUMER)) == 2,
                         message="the failed batch's span")
    finally:
        await broker.stop()

    orders, invoices, _ = sorted(spans(exporter, SpanKind.PRODUCER), key=lambda p: p.start_time)
    billed, failed = sorted(spans(exporter, SpanKind.CONSUMER), key=lambda c: c.start_time)
    assert (orders.name, invoices.name) == ("publish orders", "publish invoices")
    assert child_of(billed, orders) and child_of(invoices, billed)
    assert invoices.attributes["messaging.batch.message_count"] == 2
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.events[0].attributes["exception.type"] == "ValueError"


def test_sqlmq_imports_without_opentelemetry_and_the_middleware_names_the_extra() -> None:
    script = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if it were not installed\n"
        "import sqlmq\n"
        "from sqlmq import Broker, TracingMiddleware\n"
        "Broker('memory://')\n"
        "try:\n"
        "    TracingMiddleware()\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True)
    assert "pip install 'sqlmq[otel]'" in out.stdout, out


@on_every_engine
async def test_trace_headers_carry_a_context_where_no_middleware_publishes(
    broker: Broker, db_url: str, prefix: str, provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    """What a publisher without the middleware (the Spark sink's rows) does to carry a
    trace: headers from trace_headers(), taken in the span."""
    broker.add_middleware(TracingMiddleware(tracer_provider=provider))
    plain = sibling(broker, db_url, prefix)  # another process, no middleware

    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        pass

    assert trace_headers() == {}  # no span current: nothing to carry
    with provider.get_tracer("job").start_as_current_span("job"):
        headers = trace_headers()
    assert set(headers) == {"traceparent"}
    await plain.publish("q", "row", headers=headers)
    await broker.start()
    try:
        await wait_until(lambda: len(spans(exporter, SpanKind.CONSUMER)) == 1,
                         message="the consumer span")
    finally:
        await broker.stop()
        await plain.close()

    (job,) = [s for s in exporter.get_finished_spans() if s.name == "job"]
    (consumer,) = spans(exporter, SpanKind.CONSUMER)
    assert child_of(consumer, job)
