"""The inbox's throughput: RabbitMQ, NATS JetStream and Redis Streams into a sqlmq queue on
PostgreSQL, exactly once.

    .venv/bin/python -m bench.run inbox [--n 20000] [--repeat 3] [--sources amqp,nats,redis]
                                        [--no-peer]
    (or: .venv/bin/python -m bench.inbox …, the same options)

Per far broker, in the same rounds (medians of ``--repeat``, the order of the cases rotated
by one each round), ``--n`` messages of 64 bytes, each with its own id, are put in the far
queue or stream before each case, which then takes them all:

* sqlmq: ``Inbox`` with its defaults (batches of 500, prefetch 1,000): each batch published
  with a ledger row per message in one transaction, committed, then acknowledged; timed from
  ``start()`` (connecting included) until every message is taken.
* bare consumer: the same reads and acknowledgements with no database, the ceiling: RabbitMQ
  a consumer with a prefetch of 1,000 acknowledging each batch of up to 500 at once
  (``multiple``); JetStream a durable pull consumer fetching 500 at a time, each message
  acknowledged, then a flush; Redis ``XREADGROUP COUNT 500`` and one ``XACK`` per batch.
* sqlmq ``Inbox`` from a source that hands over at once: the database's part alone (each
  batch's transaction of 500 messages and 500 ledger rows), the inbox's ceiling here.
* faststream-sqlbroker has no inbox (nothing takes a far broker's messages into it once):
  the peer is the one its users would write by hand, a FastStream subscriber of the far
  queue (prefetch 1,000) or stream (a pull consumer, batches of 500) whose handler
  publishes each message into SqlBroker, a transaction per message, acknowledged after,
  without deduplication (bench/peer_sqlbroker.py ``inbox``). RabbitMQ and JetStream only:
  FastStream's Redis client is not in its venv.

Each row gives the CPU its Python process used per message (the far broker's and the
database's are not in it).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from sqlalchemy import func, select

from sqlmq import Broker, Inbox
from sqlmq.relay.source import FarMessage

from .common import PAYLOAD, PG_URL, PREFIX, drop_tables, median, table
from .relay import AMQP_URL, NATS_URL, REDIS_URL, cpu_seconds, log, peer_run

NAME = f"bench-inbox-{os.getpid()}"
SOURCES = {"amqp": "RabbitMQ", "nats": "JetStream", "redis": "Redis Streams"}
BATCH = 500  # the inbox's default batch; the bare consumers read as much at a time
PREFETCH = 2 * BATCH


class Origin:
    """The far queue or stream the messages come from: a durable RabbitMQ queue, a
    JetStream file stream, a Redis stream; filled anew before each case."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.stream = NAME.upper().replace("-", "_")
        self.subject = f"{NAME}.in"
        self.url = {"amqp": AMQP_URL, "nats": NATS_URL, "redis": REDIS_URL}[source]
        self.inbox_options: dict[str, Any] = (
            {"queue_name": NAME} if source == "amqp" else
            {"stream": self.stream, "subject": self.subject} if source == "nats" else
            {"stream": NAME})
        self.fills = 0

    async def __aenter__(self) -> Origin:
        if self.source == "amqp":
            import aio_pika

            self.conn = await aio_pika.connect(AMQP_URL)
            self.channel = await self.conn.channel(publisher_confirms=True)
            self.queue = await self.channel.declare_queue(NAME, durable=True)
        elif self.source == "nats":
            import nats

            self.conn = await nats.connect(NATS_URL)
            self.js = self.conn.jetstream()
        else:
            from redis.asyncio import from_url

            self.conn = from_url(REDIS_URL)
        await self.empty()
        return self

    async def empty(self) -> None:
        if self.source == "amqp":
            await self.queue.purge()
        elif self.source == "nats":
            import nats.js.errors

            try:
                await self.js.delete_stream(self.stream)
            except nats.js.errors.NotFoundError:
                pass
            await self.js.add_stream(name=self.stream, subjects=[f"{NAME}.>"])
        else:
            await self.conn.delete(NAME)

    async def fill(self, n: int) -> None:
        """``n`` messages of 64 bytes, each with an id of its own, confirmed by the broker."""
        await self.empty()
        self.fills += 1
        token = f"f{self.fills}-"
        if self.source == "redis":
            for start in range(0, n, 1000):
                pipe = self.conn.pipeline(transaction=False)
                for _ in range(start, min(n, start + 1000)):
                    pipe.xadd(NAME, {"body": PAYLOAD})
                await pipe.execute()
            return
        if self.source == "amqp":
            from aiormq import spec

            frames = await self.channel.get_underlay_channel()

            async def send(i: int) -> None:
                await frames.basic_publish(
                    PAYLOAD, exchange="", routing_key=NAME, mandatory=True, wait=False,
                    properties=spec.Basic.Properties(delivery_mode=2, message_id=f"{token}{i}"))
        else:
            async def send(i: int) -> None:
                await (await self.js.publish_async(self.subject, PAYLOAD,
                                                   headers={"Nats-Msg-Id": f"{token}{i}"}))

        ids = iter(range(n))

        async def sender() -> None:
            for i in ids:
                await send(i)

        await asyncio.gather(*(sender() for _ in range(256)))

    async def __aexit__(self, *exc: object) -> None:
        if self.source == "amqp":
            await self.queue.delete(if_unused=False, if_empty=False)
            await self.conn.close()
        elif self.source == "nats":
            await self.js.delete_stream(self.stream)
            await self.conn.close()
        else:
            await self.conn.delete(NAME)
            await self.conn.aclose()


class InstantSource:
    """A far broker that hands over ``n`` messages (each with its own key) as fast as they
    are asked for and takes acknowledgements at once: the inbox's database part alone."""

    shown = "a source that hands over at once"

    def __init__(self, n: int) -> None:
        self.left = n
        self.taken = 0

    async def open(self) -> str:
        return f"instant-{os.getpid()}"

    async def fetch(self, limit: int, wait: float) -> list[FarMessage]:
        count = min(limit, self.left)
        if not count:  # none left: wait, as a far broker's fetch does
            await asyncio.sleep(wait)
            return []
        self.left -= count
        first, self.taken = self.taken, self.taken + count
        return [FarMessage(key=f"k{first + i}", body=PAYLOAD, headers={})
                for i in range(count)]

    async def ack(self, messages: Any) -> None:
        pass

    async def refuse(self, message: Any, reason: str) -> None:
        pass

    async def close(self) -> None:
        pass


async def inbox_sqlmq(origin: Origin | None, n: int) -> tuple[float, float]:
    """Seconds for ``Inbox``'s defaults to take ``n`` waiting messages into PostgreSQL
    (from ``origin``, or from :class:`InstantSource`), and the CPU seconds this process
    used meanwhile."""
    drop_tables(PG_URL)
    broker = Broker(PG_URL, table_prefix=PREFIX)
    try:
        await broker.migrate()
        if origin is None:
            inbox = Inbox(broker, "inbox", source=AMQP_URL, queue_name="unused")
            inbox.source = InstantSource(n)
        else:
            inbox = Inbox(broker, "inbox", source=origin.url, **origin.inbox_options)
        cpu, started = cpu_seconds(), time.perf_counter()
        await inbox.start()
        while inbox.counts.taken < n:
            await asyncio.sleep(0.005)
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        await inbox.stop()
        async with broker.db.connect() as conn:
            held = (await conn.execute(select(func.count()).select_from(
                broker.schema.message))).scalar_one()
        if held != n or inbox.counts.duplicates or inbox.counts.refused:
            raise RuntimeError(f"sqlmq inbox: {held} messages in the queue for {n}, "
                               f"{inbox.counts}")
        return seconds, cpu
    finally:
        await broker.close()
        drop_tables(PG_URL)


async def inbox_bare(origin: Origin, n: int) -> tuple[float, float]:
    """Seconds for a consumer with no database to read and acknowledge ``n`` messages as
    the inbox does (batches of 500), and its CPU seconds."""
    cpu, started = cpu_seconds(), time.perf_counter()
    taken = 0
    if origin.source == "amqp":
        import aio_pika

        conn = await aio_pika.connect(AMQP_URL)
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.declare_queue(NAME, passive=True)
        arrived: asyncio.Queue[Any] = asyncio.Queue()

        async def on_message(message: Any) -> None:
            arrived.put_nowait(message)

        await queue.consume(on_message)
        while taken < n:
            batch = [await arrived.get()]
            while len(batch) < BATCH and not arrived.empty():
                batch.append(arrived.get_nowait())
            await batch[-1].ack(multiple=True)
            taken += len(batch)
        await conn.close()
    elif origin.source == "nats":
        import nats
        import nats.errors

        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        sub = await js.pull_subscribe(origin.subject, durable="bare", stream=origin.stream)
        while taken < n:
            try:
                got = await sub.fetch(BATCH, timeout=1)
            except nats.errors.TimeoutError:
                continue
            for m in got:
                await m.ack()
            await nc.flush()
            taken += len(got)
        await nc.close()
    else:
        from redis.asyncio import from_url

        r = from_url(REDIS_URL)
        await r.xgroup_create(NAME, "bare", id="0", mkstream=True)
        while taken < n:
            got = await r.xreadgroup("bare", "bare-1", {NAME: ">"}, count=BATCH, block=1000)
            ids = [entry_id for _, entries in got for entry_id, _ in entries]
            if ids:
                await r.xack(NAME, "bare", *ids)
            taken += len(ids)
        await r.aclose()
    return time.perf_counter() - started, cpu_seconds() - cpu


def inbox_peer(origin: Origin, n: int) -> tuple[float, float]:
    """The hand-written FastStream-to-SqlBroker inbox (its own venv and tables)."""
    got = peer_run("inbox", origin.source, NAME, n)
    return got["seconds"], got["cpu"]


async def throughput(source: str, n: int, repeat: int, peer: bool) -> str:
    cases: list[tuple[str, Any]] = [
        ("sqlmq Inbox, defaults", inbox_sqlmq),
        ("bare consumer, no database", inbox_bare),
        ("sqlmq Inbox from a source that hands over at once",
         lambda o, k: inbox_sqlmq(None, k)),
    ]
    if peer and source != "redis":
        cases.append(("FastStream subscriber -> SqlBroker.publish (by hand)",
                      lambda o, k: asyncio.to_thread(inbox_peer, o, k)))
    rounds: list[dict[str, tuple[float, float]]] = []
    async with Origin(source) as origin:
        for r in range(repeat):
            got: dict[str, tuple[float, float]] = {}
            for name, run in cases[r % len(cases):] + cases[:r % len(cases)]:
                await origin.fill(n)
                seconds, cpu = await run(origin, n)
                got[name] = (n / seconds, 1e6 * cpu / n)
                log(f"{source} round {r + 1}: {name} {got[name][0]:,.0f} msg/s, "
                    f"{got[name][1]:.0f} µs CPU/msg")
            rounds.append(got)
    ceiling = cases[1][0]
    peer_name = cases[3][0] if len(cases) > 3 else None
    rows = []
    for name, _ in cases:
        rates = [g[name][0] for g in rounds]
        rows.append([name, median(rates), min(rates), max(rates),
                     median([g[name][1] for g in rounds]),
                     f"{100 * median([g[name][0] / g[ceiling][0] for g in rounds]):.0f}%",
                     f"{median([g[name][0] / g[peer_name][0] for g in rounds]):.2f}x"
                     if peer_name else ""])
    return table(f"inbox {SOURCES[source]} -> PostgreSQL: {n:,} messages of 64 bytes waiting, "
                 f"taken and acknowledged, {repeat} rounds (msg/s; ratios within each round, "
                 f"then their median)",
                 ["who", "median", "min", "max", "client CPU µs/msg", "of the bare consumer",
                  "vs the hand-written peer"], rows)


def run_inbox(args: Any) -> str:
    out = []
    for source in [s for s in args.sources.split(",") if s]:
        if source not in SOURCES:
            raise SystemExit(f"--sources: {source!r} is not one of {', '.join(SOURCES)}")
        out.append(asyncio.run(throughput(source, args.n, args.repeat, not args.no_peer)))
    return "\n\n".join(out)


if __name__ == "__main__":
    import sys

    from .run import main

    main(["inbox", *sys.argv[1:]])
