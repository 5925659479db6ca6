"""Channels: what their rules cost and what they give.

* The drain of ``bench.drain`` four ways in the same run: plain; spread over 1,000
  channels without limits; over 1,000 ordered channels (one message of each at a time),
  each channel's messages published together, and published one channel after another
  (``mixed``: on SQLite, which writes whole pages at each commit, taking one message of
  each channel touches a page per message when a channel's messages are neighbours).
* A few ordered channels with deep backlogs (``deep`` in ``bench.run``): 10 of 1,000, 5 ms
  handlers, 16 workers; at best the channels over the handler's time.
* Concurrency limits: handlers that take 10 ms, channels limited to ``max_concurrency``,
  more workers than the limits allow: the throughput should be the sum of the limits
  divided by 10 ms.
* Fair sharing: 10 channels, one with 1,000 times the backlog of the others, no limits, a
  handler that takes a while: Jain's fairness index of the deliveries per channel in each
  1-second window while every channel still has work (1.0 is an even share).

PGQueuer's nearest feature (an entrypoint's ``concurrency_limit``) is not compared here.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from sqlmq import Broker, Message

from .common import QUEUE, drop_tables, fresh_broker, url_for
from .drain import PAYLOAD, SQLMQ_DRAIN, analyze, preload, publish_n, timed_drain

#: Workers for the limited runs: more than the limits let run, so the limits decide.
LIMITED_WORKERS = 64


async def _publish_spread(broker: Broker, n: int, channels: int) -> None:
    """``n`` messages, as even as can be over ``channels`` channels, one batch each: each
    channel's messages neighbours in the table."""
    for i in range(channels):
        await publish_n(broker, n // channels + (1 if i < n % channels else 0),
                        channel=f"c{i}")


async def _publish_mixed(broker: Broker, n: int, channels: int) -> None:
    """``n`` messages over ``channels`` channels in turn, one message each, as traffic from
    many tenants arrives: each channel's next messages neighbours of the other channels'
    (a transaction per round of ``channels``)."""
    for start in range(0, n, channels):
        async with broker.db.begin() as conn:
            for i in range(min(channels, n - start)):
                await broker.publish(QUEUE, PAYLOAD, channel=f"c{i}", connection=conn)


async def drain_rate(db: str, n: int, channels: int = 0, sleep: float = 0.0,
                     options: dict[str, Any] | None = None, mixed: bool = False,
                     tuned: bool = True, **defaults: Any) -> float:
    """Messages per second from start() until all ``n`` are archived. ``channels``: spread
    over that many channels, each under ``defaults`` (the queue's channel default), each
    channel's messages published together, or with ``mixed`` one channel after another.
    The subscriber takes the drain's tuned options, then ``options``; without ``tuned``,
    ``options`` alone (none: ``@broker.subscriber``'s defaults)."""
    broker = await fresh_broker(db)
    try:
        if defaults:
            await broker.set_channel_default(QUEUE, **defaults)
        if channels:
            await (_publish_mixed if mixed else _publish_spread)(broker, n, channels)
            await analyze(broker)
        else:
            await preload(broker, n)
        return await timed_drain(broker, n, {**(SQLMQ_DRAIN if tuned else {}),
                                             **(options or {})}, sleep)
    finally:
        await broker.close()
        drop_tables(url_for(db))


def jain(counts: list[int]) -> float:
    """Jain's fairness index: 1.0 when every share is equal, 1/n when one takes all."""
    total, squares = sum(counts), sum(c * c for c in counts)
    return total * total / (len(counts) * squares) if squares else 1.0


async def fairness(db: str, small: int = 100, skew: int = 1000, channels: int = 10,
                   sleep: float = 0.02, workers: int = 4) -> list[float]:
    """Jain's index per whole 1-second window while every channel had work left: channel
    ``c0`` holds ``small * skew`` messages, the others ``small`` each."""
    broker = await fresh_broker(db)
    try:
        names = [f"c{i}" for i in range(channels)]
        for i, name in enumerate(names):
            await publish_n(broker, small * (skew if i == 0 else 1), headers={"c": name},
                            channel=name)
        await analyze(broker)
        handled: list[tuple[float, str]] = []

        @broker.subscriber(QUEUE, workers=workers, fetch_batch=workers, flush_interval=0.02)
        async def handle(msg: Message) -> None:
            handled.append((time.perf_counter(), msg.headers["c"]))
            await asyncio.sleep(sleep)

        await broker.start()
        while sum(1 for _, c in handled if c != "c0") < small * (channels - 1):
            await asyncio.sleep(0.05)
        await broker.stop()
    finally:
        await broker.close()
        drop_tables(url_for(db))
    t0 = handled[0][0]
    left = {name: small * (skew if i == 0 else 1) for i, name in enumerate(names)}
    windows: list[Counter[str]] = []
    for at, name in handled:
        window = int(at - t0)
        if min(left.values()) == 0:
            break  # a channel ran out of work: the windows after it are not counted
        while len(windows) <= window:
            windows.append(Counter())
        windows[window][name] += 1
        left[name] -= 1
    complete = windows[:-1]  # the last window was cut short
    return [jain([w[name] for name in names]) for w in complete]
