"""Results of batch handlers, on every database and the in-memory engine: with ``batch=N``
and ``results=True`` the handler returns one result per message, and each message's item
is kept on its archive row by the settle that archives that message, fenced per message
(sqlmq.runtime.carried.carried_batch). ``request`` to a batch subscriber answers each
caller with its own message's result."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from sqlmq import (
    Broker,
    Message,
    MessageFailed,
    NoResult,
    ResultTimeout,
    Retry,
    State,
)

from .conftest import drop_tables, on_every_engine, rows, sibling, update_row, wait_until

pytestmark = on_every_engine

FAST: dict[str, Any] = {"flush_interval": 0.01, "max_fetch_interval": 0.05}


async def test_each_message_keeps_its_item_of_the_returned_list(broker: Broker) -> None:
    sizes: list[int] = []

    @broker.subscriber("rows", batch=10, batch_wait=0.5, results=True, **FAST)
    async def tenfold(msgs: list[Message]) -> list[int]:
        sizes.append(len(msgs))
        return [m.body["n"] * 10 for m in msgs]

    ids = await broker.publish_batch("rows", [{"n": i} for i in range(25)])
    await broker.start()
    values = [await broker.result(i, timeout=20) for i in ids]
    await broker.stop()

    assert values == [i * 10 for i in range(25)]
    assert max(sizes) > 1 and sum(sizes) == 25
    # read again at once: the archive rows keep them
    assert await broker.result(ids[3], wait=False) == 30


async def test_request_to_a_batch_subscriber_answers_each_caller_with_its_own_result(
        broker: Broker) -> None:
    sizes: list[int] = []

    @broker.subscriber("echo", batch=20, batch_wait=0.2, results=True, **FAST)
    async def echo(bodies: list[str]) -> list[str]:
        sizes.append(len(bodies))
        return [b.upper() for b in bodies]

    await broker.start()
    answers = await asyncio.gather(*(broker.request("echo", f"ping {i}", timeout=20)
                                     for i in range(30)))
    await broker.stop()

    assert answers == [f"PING {i}" for i in range(30)]
    assert sum(sizes) == 30 and max(sizes) > 1


async def test_callers_of_another_broker_are_answered_by_a_batch_subscriber(
        broker: Broker, db_url: str, prefix: str) -> None:
    """The batch subscriber runs on another broker, as another process would: each waiting
    caller hears of its own message's ending through the database (NOTIFY, SQLite's commit
    counter, polling on MariaDB)."""
    worker = sibling(broker, db_url, prefix)

    @worker.subscriber("echo", batch=10, batch_wait=0.05, results=True, **FAST)
    async def echo(bodies: list[str]) -> list[str]:
        return [b[::-1] for b in bodies]

    await worker.start()
    try:
        answers = await asyncio.gather(*(broker.request("echo", f"ping {i}", timeout=30)
                                         for i in range(12)))
    finally:
        await worker.close()
    assert answers == [f"ping {i}"[::-1] for i in range(12)]


@pytest.mark.parametrize("returned", ["short", "long", "dict", "none"])
async def test_a_return_value_that_is_not_one_result_per_message_fails_the_batch(
        broker: Broker, returned: str) -> None:
    sizes: list[int] = []

    @broker.subscriber("rows", batch=3, batch_wait=5.0, results=True,
                       retry=Retry.constant(0, max_attempts=2), **FAST)
    async def mismatched(msgs: list[Message]) -> Any:
        sizes.append(len(msgs))
        values = [m.body["n"] for m in msgs]
        return {"short": values[:-1], "long": [*values, 0], "dict": {"n": values},
                "none": None}[returned]

    ids = await broker.publish_batch("rows", [{"n": i} for i in range(3)])
    await broker.start()
    failures = []
    for i in ids:
        with pytest.raises(MessageFailed) as failed:
            await broker.result(i, timeout=20)
        failures.append(failed.value)
    await broker.stop()

    assert sizes == [3, 3]  # the retry strategy decided: two attempts each, as for a raise
    errors = {(f.error or "").splitlines()[0] for f in failures}
    assert len(errors) == 1
    (error,) = errors
    assert "batch handler " in error and "mismatched" in error and "results=True" in error
    if returned in ("short", "long"):
        got = 2 if returned == "short" else 4
        assert f"(expected 3, got {got})" in error
    else:
        assert f"returned a {'dict' if returned == 'dict' else 'NoneType'}" in error
        assert "a list of 3 results" in error
    archived = await rows(broker, "archive", queue="rows")
    assert {(r["state"], r["attempts_count"]) for r in archived} == {(State.FAILED.value, 2)}
    assert all(r["result"] is None for r in archived)


async def test_a_result_over_max_payload_bytes_fails_that_message_only(
        db_url: str, prefix: str) -> None:
    broker = Broker(db_url, table_prefix=prefix, max_payload_bytes=200)
    await broker.migrate()
    sizes: list[int] = []
    try:
        @broker.subscriber("rows", batch=3, batch_wait=5.0, results=True,
                           retry=Retry.none(), **FAST)
        async def upper(bodies: list[str]) -> list[str]:
            sizes.append(len(bodies))
            return ["x" * 500 if b == "large" else b.upper() for b in bodies]

        small, large, other = await broker.publish_batch("rows", ["a", "large", "c"])
        await broker.start()
        assert await broker.result(small, timeout=20) == "A"
        assert await broker.result(other, timeout=20) == "C"
        with pytest.raises(MessageFailed, match=rf"result of \d+ bytes for message {large}, "
                                                "over the limit of 200"):
            await broker.result(large, timeout=20)
        await broker.stop()
        assert sizes == [3]  # one batch, and only its large item failed
    finally:
        await broker.close()
        drop_tables(db_url, prefix)


async def test_a_stale_delivery_in_a_batch_keeps_no_result_and_the_others_keep_theirs(
        broker: Broker) -> None:
    started, go_on = asyncio.Event(), asyncio.Event()

    @broker.subscriber("rows", batch=2, batch_wait=5.0, renew_leases=False, results=True,
                       **FAST)
    async def named(msgs: list[Message]) -> list[str]:
        started.set()
        await go_on.wait()
        return [f"from delivery {m.deliveries}" for m in msgs]

    first, second = await broker.publish_batch("rows", [{"n": 0}, {"n": 1}])
    await broker.start()
    await wait_until(started.is_set, message="the batch started")
    # As if the first message's lease had run out and another process held it now.
    await update_row(broker, first, deliveries_count=2)
    go_on.set()
    assert await broker.result(second, timeout=20) == "from delivery 1"
    (runtime,) = broker.runtimes
    await wait_until(lambda: runtime.counters.stale == 1, message="the stale result dropped")
    await broker.stop()

    with pytest.raises(ResultTimeout, match="it is PROCESSING"):
        await broker.result(first, wait=False)  # the newer delivery's, still running
    (held,) = await rows(broker, "message", id=first)
    assert (held["state"], held["deliveries_count"]) == ("PROCESSING", 2)
    assert [r["id"] for r in await rows(broker, "archive")] == [second]


async def test_a_message_settled_by_hand_keeps_its_outcome_and_an_acked_one_its_item(
        broker: Broker) -> None:
    runs: Counter[int] = Counter()

    @broker.subscriber("rows", batch=4, batch_wait=5.0, results=True,
                       retry=Retry.constant(0, max_attempts=3), **FAST)
    async def by_hand(msgs: list[Message]) -> list[str]:
        for m in msgs:
            n = m.body["n"]
            runs[n] += 1
            if n == 0:
                m.reject("no such customer")
            elif n == 1:
                m.ack()
            elif n == 2 and runs[n] == 1:
                m.nack(delay=0)
        return [f"r{m.body['n']}" for m in msgs]

    rejected, acked, nacked, plain = await broker.publish_batch(
        "rows", [{"n": i} for i in range(4)])
    await broker.start()
    with pytest.raises(MessageFailed, match="no such customer"):
        await broker.result(rejected, timeout=20)
    assert await broker.result(acked, timeout=20) == "r1"
    assert await broker.result(nacked, timeout=20) == "r2"  # its second run's item
    assert await broker.result(plain, timeout=20) == "r3"
    await broker.stop()
    assert runs == {0: 1, 1: 1, 2: 2, 3: 1}


async def test_a_message_acked_by_hand_in_a_batch_that_raises_completes_without_a_result(
        broker: Broker) -> None:
    @broker.subscriber("rows", batch=2, batch_wait=5.0, results=True, retry=Retry.none(),
                       **FAST)
    async def ack_then_raise(msgs: list[Message]) -> list[str]:
        msgs[0].ack()
        raise RuntimeError("the warehouse is down")

    acked, other = await broker.publish_batch("rows", ["a", "b"])
    await broker.start()
    with pytest.raises(NoResult, match=r"acknowledged .* but its handler returned no value: "
                                       r"RuntimeError: the warehouse is down"):
        await broker.result(acked, timeout=20)
    with pytest.raises(MessageFailed, match="the warehouse is down"):
        await broker.result(other, timeout=20)
    await broker.stop()


async def test_an_ordered_channel_keeps_each_result_and_its_order(broker: Broker) -> None:
    order: list[int] = []

    @broker.subscriber("rows", batch=50, batch_wait=0.05, workers=4, results=True, **FAST)
    async def doubled(msgs: list[Message]) -> list[int]:
        order.extend(m.body["n"] for m in msgs if m.channel == "tenant")
        return [m.body["n"] * 2 for m in msgs]

    await broker.set_channel("tenant", ordered=True)
    ids = [await broker.publish("rows", {"n": i}, channel="tenant") for i in range(8)]
    others = await broker.publish_batch("rows", [{"n": 100 + i} for i in range(20)])
    await broker.start()
    assert await broker.request("rows", {"n": 50}, channel="tenant", timeout=20) == 100
    values = [await broker.result(i, timeout=20) for i in ids + others]
    await broker.stop()

    assert values == [i * 2 for i in range(8)] + [(100 + i) * 2 for i in range(20)]
    assert order == [*range(8), 50]


class Held:
    """The most messages of a channel that handler calls held at once."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.now = self.most = 0

    @contextmanager
    def calling(self, msgs: list[Message]) -> Iterator[None]:
        mine = [m for m in msgs if m.channel == self.channel]
        self.now += len(mine)
        self.most = max(self.most, self.now)
        try:
            yield
        finally:
            self.now -= len(mine)


async def test_a_limited_channel_keeps_each_result_within_its_limit(broker: Broker) -> None:
    held = Held("tenant")

    @broker.subscriber("rows", batch=20, batch_wait=0.05, workers=4, results=True, **FAST)
    async def doubled(msgs: list[Message]) -> list[int]:
        with held.calling(msgs):
            await asyncio.sleep(0.01)
        return [m.body["n"] * 2 for m in msgs]

    await broker.set_channel("tenant", max_concurrency=3)
    ids = await broker.publish_batch("rows", [{"n": i} for i in range(30)], channel="tenant")
    await broker.start()
    answers = await asyncio.gather(*(broker.request("rows", {"n": 100 + i}, channel="tenant",
                                                    timeout=20) for i in range(5)))
    values = [await broker.result(i, timeout=20) for i in ids]
    await broker.stop()

    assert values == [i * 2 for i in range(30)]
    assert answers == [(100 + i) * 2 for i in range(5)]
    assert 1 <= held.most <= 3


async def test_a_pipeline_batch_publishes_its_list_and_keeps_each_item(broker: Broker) -> None:
    invoices: list[dict[str, int]] = []

    @broker.subscriber("orders", batch=10, batch_wait=0.5, publish_to="invoices",
                       results=True, **FAST)
    async def bill(orders: list[dict[str, int]]) -> list[dict[str, int]]:
        return [{"order": o["id"], "total": o["total"] * 2} for o in orders]

    @broker.subscriber("invoices", **FAST)
    async def record(invoice: dict[str, int]) -> None:
        invoices.append(invoice)

    ids = await broker.publish_batch("orders", [{"id": i, "total": i} for i in range(6)])
    await broker.start()
    values = [await broker.result(i, timeout=20) for i in ids]
    await wait_until(lambda: len(invoices) == 6, message="six invoices")
    await broker.stop()

    assert values == [{"order": i, "total": 2 * i} for i in range(6)]
    assert sorted(invoices, key=lambda v: v["order"]) == values


async def test_a_request_to_a_batch_subscriber_without_results_gets_no_result_at_once(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    @broker.subscriber("plain", batch=10, batch_wait=0.05, **FAST)
    async def plain(bodies: list[str]) -> list[str]:
        return bodies

    await broker.start()
    with caplog.at_level(logging.WARNING, logger="sqlmq"):
        with pytest.raises(NoResult, match="results=True"):
            await broker.request("plain", "x", timeout=20)
    await broker.stop()
    assert "keeps no results: register it with results=True" in caplog.text


async def test_a_message_acked_in_a_batch_cut_short_by_a_lost_lease_says_why_it_has_no_result(
        broker: Broker) -> None:
    runs: list[list[int]] = []
    bumped = asyncio.Event()

    @broker.subscriber("rows", batch=2, batch_wait=5.0, lease=3.0, results=True, **FAST)
    async def load(msgs: list[Message]) -> list[str]:
        runs.append([m.id for m in msgs])
        if len(runs) == 1:
            msgs[1].ack()
            await bumped.wait()
            await asyncio.Event().wait()  # until the lost lease cancels the batch
        return ["again" for _ in msgs]

    first, second = await broker.publish_batch("rows", ["a", "b"])
    await broker.start()
    await wait_until(lambda: bool(runs), message="the batch started")
    # As if the first message's lease had run out and another process held it now: its
    # next renewal fails, and the batch is cancelled before it returns.
    await update_row(broker, first, deliveries_count=2)
    bumped.set()
    with pytest.raises(NoResult, match=r"acknowledged .* but its handler returned no value: its "
                                       r"batch was cut short before handler .*load returned"):
        await broker.result(second, timeout=20)
    await broker.stop()
    assert runs[0] == [first, second]
