"""Prometheus metrics (sqlmq.metrics), scraped over HTTP after a known workload on every
engine: the counts must be exact. Timings are only checked to be counted, never for their
values."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sqlmq import Broker, ConfigurationError, Message, PrometheusMetrics, Retry, serve_metrics

from .conftest import on_every_engine, sibling, wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
FAST_BATCH = {"flush_interval": 0.01, "max_fetch_interval": 0.05}


async def scrape(port: int) -> Samples:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
            return reply.read().decode()

    text = await asyncio.to_thread(get)
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@on_every_engine
async def test_a_known_workload_is_counted_exactly(broker: Broker) -> None:
    metrics = serve_metrics(broker, 0, queue_depth_interval=0)
    assert broker.metrics is metrics and broker.middleware[0] is metrics

    # no lease renewal, so the only extensions are the handler's; a lease long enough that
    # none expires however loaded the machine (no stale result, no redelivery)
    @broker.subscriber("q", workers=4, retry=Retry.constant(0, max_attempts=2), lease=600,
                       renew_leases=False, flush_interval=0.01, max_fetch_interval=0.05)
    async def handle(msg: Message) -> None:
        kind, i = msg.body["kind"], msg.body["i"]
        if kind == "ok" and i < 4:
            assert await msg.extend(600)  # 4 lease extensions, the only ones (no renewal)
        if kind == "bad" or (kind == "flaky" and msg.deliveries == 1):
            raise ValueError(kind)

    await broker.start()
    assert metrics.port  # port 0: a free one, bound at start
    try:
        await broker.publish_batch("q", [{"kind": "ok", "i": i} for i in range(20)])
        for i in range(5):
            await broker.publish("q", {"kind": "flaky", "i": i})
        for i in range(3):
            await broker.publish("q", {"kind": "bad", "i": i})

        def done() -> bool:
            r = metrics.registry
            return (r.get_sample_value("sqlmq_messages_processed_total", {"queue": "q"}) == 25
                    and r.get_sample_value("sqlmq_messages_dead_lettered_total",
                                           {"queue": "q"}) == 3)

        await wait_until(done, message="25 completed and 3 dead-lettered")
        samples = await scrape(metrics.port)
    finally:
        await broker.stop()

    assert value(samples, "sqlmq_messages_processed_total", queue="q") == 25
    assert value(samples, "sqlmq_messages_failed_total", queue="q") == 5 + 3 * 2
    assert value(samples, "sqlmq_messages_retried_total", queue="q") == 5 + 3
    assert value(samples, "sqlmq_messages_dead_lettered_total", queue="q") == 3
    assert value(samples, "sqlmq_messages_published_total", queue="q") == 28
    for outcome, count in (("COMPLETED", 25), ("RETRY", 8), ("FAILED", 3)):
        assert value(samples, "sqlmq_messages_settled_total", queue="q",
                     outcome=outcome) == count
    assert value(samples, "sqlmq_stale_results_total", queue="q") is None  # none dropped
    # 36 handler runs: 25 that returned, 11 that raised
    assert value(samples, "sqlmq_handler_duration_seconds_count", queue="q",
                 result="success") == 25
    assert value(samples, "sqlmq_handler_duration_seconds_count", queue="q",
                 result="error") == 11
    assert value(samples, "sqlmq_end_to_end_latency_seconds_count", queue="q",
                 outcome="COMPLETED") == 25
    assert value(samples, "sqlmq_end_to_end_latency_seconds_count", queue="q",
                 outcome="FAILED") == 3
    # every result written once, in some number of flushes
    assert value(samples, "sqlmq_flush_batch_size_sum", queues="q") == 36
    flushes = value(samples, "sqlmq_flush_duration_seconds_count", queues="q")
    assert flushes is not None and 1 <= flushes <= 36
    assert value(samples, "sqlmq_flush_batch_fill_count", queues="q") == flushes
    fetched = value(samples, "sqlmq_fetch_batch_size_sum", queues="q")
    assert fetched is not None and fetched <= 36  # the rest handed over at publish
    # One observation of each per acquire. Compared in the registry after the stop, not in
    # the scrape: the scrape renders one family after the other in the server's thread while
    # the fetcher, still polling, may observe an acquire between the two (13 fills, 12 sizes).
    fills = metrics.registry.get_sample_value("sqlmq_fetch_batch_fill_count", {"queues": "q"})
    sizes = metrics.registry.get_sample_value("sqlmq_fetch_batch_size_count", {"queues": "q"})
    assert fills is not None and fills == sizes
    assert value(samples, "sqlmq_lease_extensions_total", queues="q") == 4
    assert value(samples, "sqlmq_leases_lost_total", queues="q") is None
    assert value(samples, "sqlmq_in_flight", queues="q") == 0
    assert value(samples, "sqlmq_prefetched", queues="q") == 0
    for state, count in (("pending", 0), ("processing", 0), ("retryable", 0),
                         ("completed", 25), ("failed", 3), ("expired", 0), ("cancelled", 0)):
        assert value(samples, "sqlmq_queue_messages", queue="q", state=state) == count
    assert value(samples, "sqlmq_queue_oldest_ready_seconds", queue="q") == 0


@on_every_engine
async def test_a_batch_call_is_timed_once_and_its_failures_counted_per_message(
        broker: Broker) -> None:
    metrics = serve_metrics(broker, 0, queue_depth=False)
    calls: dict[str, list[int]] = {"good": [], "bad": []}

    @broker.subscriber("good", batch=4, batch_wait=0.2, lease=600, renew_leases=False,
                       **FAST_BATCH)
    async def good(msgs: list[Message]) -> None:
        calls["good"].append(len(msgs))

    @broker.subscriber("bad", batch=4, batch_wait=0.2, lease=600, renew_leases=False,
                       retry=Retry.constant(0, max_attempts=2), **FAST_BATCH)
    async def bad(msgs: list[Message]) -> None:
        calls["bad"].append(len(msgs))
        raise ValueError("always")

    await broker.publish_batch("good", list(range(10)))
    await broker.publish_batch("bad", list(range(3)))
    await broker.start()
    try:
        def done() -> bool:
            r = metrics.registry
            return (r.get_sample_value("sqlmq_messages_processed_total", {"queue": "good"}) == 10
                    and r.get_sample_value("sqlmq_messages_dead_lettered_total",
                                           {"queue": "bad"}) == 3)

        await wait_until(done, message="10 completed and 3 dead-lettered")
        samples = await scrape(metrics.port)
    finally:
        await broker.stop()

    # a call is one handler run, timed once; the messages per call are counted apart
    assert value(samples, "sqlmq_handler_duration_seconds_count", queue="good",
                 result="success") == len(calls["good"])
    assert value(samples, "sqlmq_batch_size_count", queue="good") == len(calls["good"])
    assert value(samples, "sqlmq_batch_size_sum", queue="good") == 10
    assert value(samples, "sqlmq_messages_failed_total", queue="good") is None
    # a failure is each message's: 3 messages, 2 attempts each
    assert sum(calls["bad"]) == 6
    assert value(samples, "sqlmq_messages_failed_total", queue="bad") == 6
    assert value(samples, "sqlmq_handler_duration_seconds_count", queue="bad",
                 result="error") == len(calls["bad"])
    assert value(samples, "sqlmq_batch_size_sum", queue="bad") == 6
    assert value(samples, "sqlmq_messages_retried_total", queue="bad") == 3


@on_every_engine
async def test_the_gauges_show_handlers_in_flight_and_the_backlog(broker: Broker) -> None:
    metrics = serve_metrics(broker, 0, queue_depth_interval=0)
    release = asyncio.Event()
    running: list[int] = []

    @broker.subscriber("slow", workers=2, prefetch=4, fetch_batch=4, flush_interval=0.01,
                       max_fetch_interval=0.05)
    async def slow(msg: Message) -> None:
        running.append(msg.id)
        await release.wait()

    await broker.publish_batch("slow", list(range(10)))
    await broker.start()
    try:
        # 2 running and the prefetch full (4): the fetcher asks for no more
        await wait_until(lambda: len(running) == 2 and broker.runtimes[0].buffered == 4,
                         message="both workers busy and 4 prefetched")
        assert metrics.port is not None
        samples = await scrape(metrics.port)
        assert value(samples, "sqlmq_in_flight", queues="slow") == 2
        assert value(samples, "sqlmq_prefetched", queues="slow") == 4
        assert value(samples, "sqlmq_queue_messages", queue="slow", state="processing") == 6
        assert value(samples, "sqlmq_queue_messages", queue="slow", state="pending") == 4
        assert value(samples, "sqlmq_queue_oldest_ready_seconds", queue="slow") is not None
    finally:
        release.set()
        await broker.stop()


@on_every_engine
async def test_the_broker_option_serves_while_running_and_each_broker_has_its_own(
    broker: Broker, db_url: str, prefix: str,
) -> None:
    other = sibling(broker, db_url, prefix, metrics_port=0)
    assert isinstance(other.metrics, PrometheusMetrics) and other.metrics.port is None
    mine = serve_metrics(broker, 0, queue_depth=False)
    assert mine.registry is not other.metrics.registry

    @broker.subscriber("a", flush_interval=0.01)
    async def a(msg: Message) -> None:
        pass

    @other.subscriber("b", flush_interval=0.01)
    async def b(msg: Message) -> None:
        pass

    await broker.start()
    await other.start()
    try:
        await broker.publish("a", "x")
        await wait_until(lambda: mine.registry.get_sample_value(
            "sqlmq_messages_processed_total", {"queue": "a"}) == 1, message="a handled")
        port, other_port = mine.port, other.metrics.port
        assert port and other_port and port != other_port
        samples, other_samples = await scrape(port), await scrape(other_port)
        assert value(samples, "sqlmq_messages_processed_total", queue="a") == 1
        assert value(other_samples, "sqlmq_messages_processed_total", queue="a") is None
        assert not any(name == "sqlmq_queue_messages" for name, _ in samples)  # turned off
    finally:
        await broker.stop()
        await other.stop()
        await other.close()

    assert mine.port is None and not mine.serving
    with pytest.raises(urllib.error.URLError):
        await scrape(port)


@on_every_engine
async def test_serve_metrics_is_called_before_start(broker: Broker) -> None:
    @broker.subscriber("a")
    async def a(msg: Message) -> None:
        pass

    await broker.start()
    try:
        with pytest.raises(ConfigurationError, match="before start"):
            serve_metrics(broker, 0)
    finally:
        await broker.stop()


def test_a_port_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="from 0 to 65535"):
        PrometheusMetrics(port=70000)

