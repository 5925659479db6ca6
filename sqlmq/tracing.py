"""OpenTelemetry tracing, as a middleware (:mod:`sqlmq.middleware`); the extra
``sqlmq[otel]`` installs OpenTelemetry.

::

    broker.add_middleware(TracingMiddleware())      # the global TracerProvider, or pass one

* A publish makes one PRODUCER span (``publish <queue or topic>``), one per publish call:
  a batch is one span with ``messaging.batch.message_count``, a single message's span has
  its ``messaging.message.id``. The span's context goes into every message's headers
  (W3C ``traceparent``/``tracestate``, by the propagator: the global one by default). This
  holds on every publish path: async and sync, topics, in the caller's transaction (the
  outbox: the span covers the insert, the commit is the caller's), and a pipeline step's
  output, published in its handler's span.
* Handling a delivery makes one CONSUMER span (``process <queue>``) whose parent is the
  context in its headers, so one trace runs from the producer through the consumer (and on
  through a pipeline), with ``messaging.system`` ``sqlmq``, ``messaging.destination.name``,
  ``messaging.message.id`` and ``messaging.sqlmq.message.delivery_count``; a handler that
  raises leaves the exception on the span and its status ERROR. A message without trace
  headers starts a new trace.
* A batch handler's call (``batch=``) makes one CONSUMER span for the batch, ``process
  <queue>`` (its queues joined by commas, and no ``messaging.destination.name``, when a
  subscriber of several queues got messages of more than one), with
  ``messaging.batch.message_count`` and the messages' ids (``messaging.sqlmq.message.ids``),
  and a link to each producer span the batch's messages came from (the link's
  ``messaging.batch.message_count`` says how many), as the messaging conventions have a
  batch's processing: one call handles them all, and a span per message would claim each
  took the batch's time. When every message came from one
  producer span (a ``publish_batch``), that span is also its parent, so the common case
  stays one trace; otherwise the batch starts a trace of its own.

Per call rather than per message: a batch of 10,000 messages is one operation of the
producer, and one span per message would cost more than the insert.

The Spark sink publishes from Spark's own Python workers, where the context of the
program that started the job is not current; give its rows a ``headers`` column with
:func:`trace_headers` taken where the job is started to carry it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .middleware import CallNext, CallNextBatch, Middleware, PublishBatch

if TYPE_CHECKING:
    from .message import Message

__all__ = ["TracingMiddleware", "trace_headers"]

#: The instrumentation scope the spans are made under.
SCOPE = "sqlmq"


def _otel() -> Any:
    try:
        from opentelemetry import propagate, trace
    except ImportError as exc:
        raise ImportError("sqlmq's tracing needs OpenTelemetry: pip install 'sqlmq[otel]' "
                          "(opentelemetry-api and opentelemetry-sdk)") from exc
    return trace, propagate


def trace_headers(context: Any = None) -> dict[str, str]:
    """The headers that carry ``context`` (default: the current one) with the global
    propagator: ``traceparent`` (and ``tracestate``) while a span is current, else none."""
    _, propagate = _otel()
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return carrier


class TracingMiddleware(Middleware):
    """A PRODUCER span per publish and a CONSUMER span per handled delivery, linked through
    the messages' headers. ``tracer_provider``: where the spans go (default: the global
    one); ``propagator``: how the context is written into headers and read back (default:
    the global one, W3C trace context and baggage unless configured otherwise)."""

    def __init__(self, tracer_provider: Any = None, propagator: Any = None) -> None:
        trace, propagate = _otel()
        from opentelemetry.trace import Link, SpanKind

        self._kinds = SpanKind
        self._link = Link
        self._span_of = trace.get_current_span
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        self.propagator = propagator if propagator is not None else propagate.get_global_textmap()

    def publish(self, batch: PublishBatch) -> Any:
        return self._publishing(batch)

    @contextmanager
    def _publishing(self, batch: PublishBatch) -> Iterator[None]:
        attributes: dict[str, Any] = {
            "messaging.system": "sqlmq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": batch.destination,
        }
        if len(batch) != 1:
            attributes["messaging.batch.message_count"] = len(batch)
        if batch.topic is not None:
            attributes["messaging.sqlmq.topic"] = batch.topic
        with self.tracer.start_as_current_span(
                f"publish {batch.destination}", kind=self._kinds.PRODUCER,
                attributes=attributes) as span:
            carrier: dict[str, str] = {}
            self.propagator.inject(carrier)  # the current context: this span's
            for name, value in carrier.items():
                batch.set_header(name, value)
            yield
            if batch.ids is not None and len(batch.ids) == 1:
                span.set_attribute("messaging.message.id", str(batch.ids[0]))

    async def handle(self, msg: Message, call_next: CallNext) -> Any:
        parent = self.propagator.extract(msg.headers)
        with self.tracer.start_as_current_span(
                f"process {msg.queue}", context=parent, kind=self._kinds.CONSUMER,
                attributes={
                    "messaging.system": "sqlmq",
                    "messaging.operation.type": "process",
                    "messaging.operation.name": "process",
                    "messaging.destination.name": msg.queue,
                    "messaging.message.id": str(msg.id),
                    "messaging.sqlmq.message.delivery_count": msg.deliveries,
                }):
            return await call_next(msg)

    async def handle_batch(self, msgs: list[Message], call_next: CallNextBatch) -> Any:
        # the producer spans, by (trace id, span id): their context and the messages of the
        # batch they published (a span context is no dict key: its trace state is a dict)
        sources: dict[tuple[int, int], tuple[Any, int]] = {}
        for m in msgs:
            source = self._span_of(self.propagator.extract(m.headers)).get_span_context()
            if source.is_valid:
                key = (source.trace_id, source.span_id)
                sources[key] = (source, sources.get(key, (source, 0))[1] + 1)
        one_source = len(sources) == 1 and sum(n for _, n in sources.values()) == len(msgs)
        parent = self.propagator.extract(msgs[0].headers if one_source else {})
        queues = sorted({m.queue for m in msgs})
        attributes: dict[str, Any] = {
            "messaging.system": "sqlmq",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.batch.message_count": len(msgs),
            "messaging.sqlmq.message.ids": [str(m.id) for m in msgs],
        }
        if len(queues) == 1:
            attributes["messaging.destination.name"] = queues[0]
        links = [self._link(source, {"messaging.batch.message_count": n})
                 for source, n in sources.values()]
        with self.tracer.start_as_current_span(
                f"process {','.join(queues)}", context=parent, kind=self._kinds.CONSUMER,
                attributes=attributes, links=links):
            return await call_next(msgs)
