"""An ordered channel's window, on the three databases: a publish leaves the first
``ORDERED_WINDOW`` waiting messages of an ordered channel (without other limits) in the fair
read and blocks the others (their keys raised by ``BLOCKED``), so that an acquire never reads
a deep backlog behind a running head; once the window is down to ``ORDERED_LOOKAHEAD``
behind the head, each take lets the next one in; a window that ran out otherwise (its
messages cancelled) is mended; settings that stop being ordered unblock everything.
Whatever the window, messages start in publish order, one at a time.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sqlmq import Broker, Message, Retry
from sqlmq.channels import (
    BLOCKED,
    ORDERED_LOOKAHEAD,
    ORDERED_PARK_AFTER,
    ORDERED_WINDOW,
    turn_of,
)
from sqlmq.engines.sql import fair as core_fair
from sqlmq.lifecycle import Outcome
from sqlmq.records import Delivery, Settlement

from .conftest import rows, sibling, update_row, wait_until


async def window(broker: Broker, channel: str = "o") -> tuple[list[int], list[int]]:
    """The ids of ``channel``'s messages in the fair read and behind it, in key order;
    checks that the first are a prefix of the channel's key order (every key in the window
    below every key behind it)."""
    found = sorted(await rows(broker, "message", channel=channel),
                   key=lambda r: (r["fair_key"], r["id"]))
    inside = [r["id"] for r in found if r["fair_key"] < BLOCKED]
    behind = [r["id"] for r in found if r["fair_key"] >= BLOCKED]
    assert [r["id"] for r in found] == inside + behind
    return inside, behind


async def take_one(broker: Broker) -> list[Delivery]:
    return await broker.engine.acquire(["q"], 10, 30)


async def complete(broker: Broker, d: Delivery) -> None:
    assert await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE)]) \
        == {d.id}


async def after_mending(broker: Broker) -> list[Delivery]:
    """What the first acquire to find something takes, once the mending let it in."""
    got: list[Delivery] = []

    async def starts() -> bool:
        got.extend(await take_one(broker))
        return bool(got)

    await wait_until(starts, timeout=10, interval=0.05,
                     message="the mending to let the first blocked message in")
    return got


async def run_out(broker: Broker) -> list[int]:
    """Take and complete the channel's messages one by one; their ids, as started."""
    started = []
    while got := await take_one(broker):
        assert len(got) == 1
        started.append(got[0].id)
        await complete(broker, got[0])
    return started


async def test_a_publish_blocks_what_the_window_cannot_hold_and_each_take_lets_one_in(
        broker: Broker) -> None:
    await broker.set_channel("o", ordered=True)
    sent = [await broker.publish("q", i, channel="o") for i in range(10)]
    sent += await broker.publish_batch("q", range(10, 40), channel="o")
    inside, behind = await window(broker)
    assert inside == sent[:ORDERED_WINDOW] and behind == sent[ORDERED_WINDOW:]

    started = []
    for _ in range(len(sent)):
        got = await take_one(broker)
        assert [d.id for d in got] == [sent[len(started)]]  # the head only
        started.append(got[0].id)
        inside, behind = await window(broker)
        # The head runs, the window behind it shrinks to the lookahead, then keeps it
        # while blocked ones are left.
        left = len(sent) - len(started)
        assert inside == sent[len(started) - 1:][:len(inside)]
        assert len(inside) == 1 + min(max(ORDERED_WINDOW - len(started), ORDERED_LOOKAHEAD),
                                      left)
        assert await take_one(broker) == []  # nothing else while the head runs
        await complete(broker, got[0])
    assert started == sent
    assert await window(broker) == ([], [])


async def test_a_channel_whose_turns_jump_lets_its_next_in_without_mending(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish that finds its queue's clock ahead of the channel's last turn gives its
    messages turns from there: the window is counted in messages, not turns, so the takes
    still let the next in across the jump (no mending: it is switched off here)."""
    from sqlalchemy import update

    monkeypatch.setattr(core_fair.HeadMending, "due", lambda self, transaction: None)
    await broker.set_channel("o", ordered=True)
    sent = await broker.publish_batch("q", range(ORDERED_WINDOW + 2), channel="o")
    k = broker.schema.channel_clock
    async with broker.db.begin() as conn:  # as other channels' acquires move it on
        if not (await conn.execute(update(k).where(k.c.queue == "q").values(turn=1000))
                ).rowcount:
            await conn.execute(k.insert().values(queue="q", turn=1000))
    sent += await broker.publish_batch("q", range(5), channel="o")
    keys = {r["id"]: turn_of(r["fair_key"]) for r in await rows(broker, channel="o")}
    assert keys[sent[-1]] > 1000 > keys[sent[-6]]
    assert await run_out(broker) == sent


async def test_a_retried_head_keeps_its_place_and_the_window_does_not_grow(
        broker: Broker) -> None:
    await broker.set_channel("o", ordered=True)
    sent = await broker.publish_batch("q", range(30), channel="o")
    for _ in range(3):
        (head,) = await take_one(broker)
        assert head.id == sent[0]
        assert await broker.engine.settle(
            [Settlement(head.id, head.deliveries, Outcome.RETRY)]) == {head.id}
        inside, _ = await window(broker)
        assert inside == sent[:ORDERED_WINDOW]  # the retries let nothing in
    assert await run_out(broker) == sent


async def test_a_window_emptied_by_cancels_is_mended(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelling waiting messages takes them out of the window without letting others in;
    once it is empty, the acquire's mending (at most once an interval) lets the next in.

    The pass counts what it let in after its transaction, and the message is there to take
    from its commit on: on MariaDB the connection's return to the pool (a rollback, one
    more round trip) came between, and an acquire took the message before the pass had
    counted it. Here that return is made slow on every engine, and the count is read once
    the pass has ended."""
    monkeypatch.setattr(core_fair, "CHANNEL_LOOK_INTERVAL", 0.1)
    engine = broker.engine
    transaction = engine._transaction

    async def slow_to_return(work: Any) -> Any:
        done = await transaction(work)
        await asyncio.sleep(0.3)
        return done

    monkeypatch.setattr(engine, "_transaction", slow_to_return)
    await broker.set_channel("o", ordered=True)
    sent = await broker.publish_batch("q", range(ORDERED_WINDOW + 5), channel="o")
    for msg_id in sent[:ORDERED_WINDOW]:
        assert (await broker.cancel(msg_id)).outcome == "cancelled"
    assert await window(broker) == ([], sent[ORDERED_WINDOW:])
    got = await after_mending(broker)
    assert [d.id for d in got] == [sent[ORDERED_WINDOW]]
    await wait_until(lambda: engine._mending.task is None, message="the mending pass's end")
    assert engine._mending.let_in == 1
    await complete(broker, got[0])
    assert [got[0].id, *await run_out(broker)] == sent[ORDERED_WINDOW:]


async def test_a_head_whose_letting_in_was_missed_is_followed_after_the_mending(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a publish racing the take of the head leaves (see ``HeadMending``): the head
    runs, the one behind it blocked though the window had room. After the head, the
    blocked one starts, by the mending."""
    monkeypatch.setattr(core_fair, "CHANNEL_LOOK_INTERVAL", 0.1)
    await broker.set_channel("o", ordered=True)
    first, second = await broker.publish_batch("q", [1, 2], channel="o")
    (head,) = await take_one(broker)
    assert head.id == first
    (row,) = await rows(broker, "message", id=second)
    await update_row(broker, second, fair_key=row["fair_key"] + BLOCKED)
    await complete(broker, head)
    got = await after_mending(broker)
    assert [d.id for d in got] == [second]


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_a_mending_pass_with_nothing_to_mend_waits_on_no_settle(broker: Broker) -> None:
    """A settle deletes the heads it archives; a mending pass that finds no channel to
    mend must neither wait for it nor hold it up. MariaDB takes shared locks on what an
    update's subqueries read of the table it updates: the mending's update read every
    ordered channel's first entry, so it waited on a head being deleted here, and in a
    drain a settle deleting two heads deadlocked with it. The head's delete is held open
    on another connection; the pass ends at once, and lets nothing in."""
    from sqlalchemy import delete

    await broker.set_channel_default("q", ordered=True)
    for c in range(3):
        await broker.publish_batch("q", [1, 2], channel=f"o{c}")
    heads = await broker.engine.acquire(["q"], 10, 30)
    assert len(heads) == 3
    m = broker.schema.message
    engine = broker.engine
    async with broker.db.connect() as holder:
        await holder.begin()
        await holder.execute(delete(m).where(m.c.id == heads[1].id))
        passed = asyncio.create_task(engine._transaction(engine._mending.mend))
        done, _ = await asyncio.wait({passed}, timeout=5)
        await holder.rollback()
    assert await passed == 0
    assert done, "the mending pass waited for the held delete of a head"


async def mending_pass(broker: Broker) -> None:
    """An acquire that finds nothing, and the mending pass it starts, run to its end
    (after the one before it, and its interval)."""
    mending = broker.engine._mending
    await wait_until(lambda: mending.task is None and time.monotonic() - mending.mended_at
                     > core_fair.CHANNEL_LOOK_INTERVAL, timeout=10,
                     message="the mending's last pass and its interval")
    before = mending.mended_at
    assert await take_one(broker) == []
    await wait_until(lambda: mending.task is None and mending.mended_at > before,
                     timeout=10, message="a mending pass")


async def test_a_head_that_waits_long_to_retry_has_its_window_parked(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A head put back to retry in more than ORDERED_PARK_AFTER: the mending blocks the
    rest of its window again, so acquires stop reading them (a head due sooner parks
    nothing, nor does another channel's head that waits in the queue behind it); a
    publish then waits behind them; once the head is due and taken, the others are let
    in one a take, and all start in publish order."""
    monkeypatch.setattr(core_fair, "CHANNEL_LOOK_INTERVAL", 0.05)
    monkeypatch.setattr(core_fair, "PARK_INTERVAL", 0.05)
    await broker.set_channel("o", ordered=True)
    await broker.set_channel("p", ordered=True, queue="other")
    sent = await broker.publish_batch("q", range(ORDERED_WINDOW), channel="o")  # all in it
    others = await broker.publish_batch("other", range(5), channel="p")
    for delay in (ORDERED_PARK_AFTER / 2, ORDERED_PARK_AFTER * 10):
        (head,) = await take_one(broker)
        assert head.id == sent[0]
        assert await broker.engine.settle(
            [Settlement(head.id, head.deliveries, Outcome.RETRY, delay=delay)]) == {head.id}
        await mending_pass(broker)
        if delay < ORDERED_PARK_AFTER:
            assert await window(broker) == (sent, [])
            assert broker.engine._mending.parked == 0
            await update_row(broker, sent[0],
                             channel_due_at=datetime.now(UTC) - timedelta(seconds=1))
    assert await window(broker) == ([sent[0]], sent[1:])
    assert broker.engine._mending.parked == ORDERED_WINDOW - 1
    assert await window(broker, "p") == (others, [])
    await mending_pass(broker)  # nothing more to park, nothing to let in: the head waits
    assert await window(broker) == ([sent[0]], sent[1:])
    sent += await broker.publish_batch("q", [10, 11], channel="o")
    assert (await window(broker))[1] == sent[1:]
    await update_row(broker, sent[0], channel_due_at=datetime.now(UTC) - timedelta(seconds=1))
    started = await run_out(broker)
    assert started == sent, [(r["id"], r["state"], r["fair_key"], r["channel_due_at"])
                             for r in await rows(broker, "message", channel="o")]


async def test_a_channel_made_ordered_blocks_its_backlog_and_unordered_unblocks_it(
        broker: Broker) -> None:
    sent = await broker.publish_batch("q", range(40), channel="o")
    (running,) = (await broker.engine.acquire(["q"], 1, 30))
    await broker.set_channel("o", ordered=True)
    inside, behind = await window(broker)
    assert inside == [running.id, *[i for i in sent if i != running.id][:ORDERED_WINDOW]]
    assert len(behind) == len(sent) - 1 - ORDERED_WINDOW
    await broker.set_channel("o")  # no limits, not ordered
    assert (await window(broker))[1] == []
    taken = {d.id for d in await broker.engine.acquire(["q"], 100, 30)}
    assert taken == set(sent) - {running.id}


async def test_a_requeue_into_a_full_window_waits_behind_it(broker: Broker) -> None:
    await broker.set_channel("o", ordered=True)
    (dead,) = await broker.publish_batch("q", ["dead"], channel="o")
    (d,) = await take_one(broker)
    assert await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL)]) \
        == {dead}
    sent = await broker.publish_batch("q", range(ORDERED_WINDOW + 2), channel="o")
    assert await broker.requeue(ids=[dead]) == 1
    inside, behind = await window(broker)
    assert inside == sent[:ORDERED_WINDOW] and behind == [*sent[ORDERED_WINDOW:], dead]
    assert await run_out(broker) == [*sent, dead]


async def three_brokers_in_order(broker: Broker, db_url: str, prefix: str,
                                 fail_every: int = 0, **options: Any) -> list[Broker]:
    """Three brokers (as three processes) on queue ``q`` of ordered channels, publishing
    60 messages to each of 4 channels in turn while they consume (with ``fail_every``,
    every such message fails its first delivery; ``options``: the subscribers'), until
    every message completed; checks that each channel's messages started in publish order
    (a retry right after its first attempt), one at a time. The brokers, closed."""
    brokers = [broker, sibling(broker, db_url, prefix), sibling(broker, db_url, prefix)]
    starts: dict[str, list[int]] = {}
    done: list[int] = []
    running: dict[str, int] = {}
    overlaps: list[str] = []
    for b in brokers:
        @b.subscriber("q", workers=8, flush_interval=0.0, max_fetch_interval=0.05, **options)
        async def handle(msg: Message) -> None:
            ch = msg.headers["ch"]
            running[ch] = running.get(ch, 0) + 1
            if running[ch] > 1:
                overlaps.append(ch)
            starts.setdefault(ch, []).append(msg.body)
            await asyncio.sleep(0.001)
            running[ch] -= 1
            if fail_every and msg.body % fail_every == 0 and msg.deliveries == 1:
                raise RuntimeError("fails once")
            done.append(msg.body)

    channels = [f"c{i}" for i in range(4)]
    await broker.set_channel_default("q", ordered=True)
    for b in brokers:
        await b.start()
    try:
        for n in range(60):
            for ch in channels:
                await brokers[n % 3].publish("q", n, headers={"ch": ch}, channel=ch)
        await wait_until(lambda: len(done) >= 60 * len(channels), timeout=90,
                         message="every message to complete")
    finally:
        for b in brokers[1:]:
            await b.close()
        await broker.stop()
    assert overlaps == []
    retried = [n for n in range(60) if fail_every and n % fail_every == 0]
    assert starts == {ch: sorted([*range(60), *retried]) for ch in channels}
    return brokers


async def test_ordered_channels_of_three_processes_keep_their_order(
        broker: Broker, db_url: str, prefix: str) -> None:
    """Three brokers publishing while they consume: each channel's messages start in
    publish order, one at a time, and all start."""
    await three_brokers_in_order(broker, db_url, prefix)


async def test_ordered_channels_of_three_processes_keep_their_order_through_parking(
        broker: Broker, db_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, with every tenth message failing once and retried after longer than
    ORDERED_PARK_AFTER (made 0.3 s), so the three brokers' mending parks windows while
    the others publish and take: the order holds, and windows were parked."""
    monkeypatch.setattr(core_fair, "ORDERED_PARK_AFTER", 0.3)
    monkeypatch.setattr(core_fair, "PARK_INTERVAL", 0.05)
    monkeypatch.setattr(core_fair, "CHANNEL_LOOK_INTERVAL", 0.05)
    brokers = await three_brokers_in_order(broker, db_url, prefix, fail_every=10,
                                           retry=Retry.constant(1.0, max_attempts=3))
    assert sum(b.engine._mending.parked for b in brokers) > 0
