"""The inbox takes far messages (RabbitMQ, NATS JetStream, Redis Streams) into a sqlmq queue
exactly once, on each database: bodies, headers and keys as sent, and a far broker's
redelivery written nothing, even after sqlmq handled and archived the message (the
ledger, not the deduplication key, which an archived message no longer holds)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sqlmq import Broker, ConfigurationError, Inbox, Message
from sqlmq.relay.ledger import Ledger
from sqlmq.relay.source import SourceUnavailable

from ..conftest import drained, rows, wait_until
from .inbox_sources import Far, Item, ack_wait

#: Messages per source and database: PostgreSQL takes the full 10,000; SQLite and MariaDB
#: fewer, so that the set stays within its time (they write each batch the same way).
SIZES = {"postgresql": 10_000, "sqlite": 2_000, "mariadb": 2_000}


def inbox(broker: Broker, far_source: Far, queue: str = "in", **options: Any) -> Inbox:
    return Inbox(broker, queue, source=far_source.url, **{**far_source.options, **options})


async def taken(broker: Broker, queue: str = "in") -> dict[str, Any]:
    """The queue's messages by their key, failing on a key met twice."""
    got = await rows(broker, "message", queue=queue)
    twice = [k for k, n in Counter(r["dedup_key"] for r in got).items() if n > 1]
    assert not twice, f"{len(twice)} keys twice in sqlmq, e.g. {twice[:5]}"
    return {r["dedup_key"]: r for r in got}


async def test_every_far_message_is_in_sqlmq_once_as_sent(broker: Broker, far_source: Far,
                                                          db_kind: str) -> None:
    """Every message once, its body, headers and key as sent. JetStream's messages are half
    keyed by ``Nats-Msg-Id``, half by their stream sequence; RabbitMQ's first hundred are
    sent twice (the same ``message_id``): taken once, the second acknowledged as seen."""
    n = SIZES[db_kind]
    items: list[Item] = [
        (None if far_source.kind == "nats" and i % 2 else f"order-{i}",
         f"body {i} é \x00 end".encode(), {"n": str(i), "kind": "order"})
        for i in range(n)]
    keys = await far_source.publish(items)
    again = 100 if far_source.kind == "rabbitmq" else 0
    await far_source.publish(items[:again])
    taker = inbox(broker, far_source)
    counts = await taker.drain(idle=1.0)
    assert (counts.taken, counts.duplicates, counts.refused) == (n, again, 0)
    by_key = await taken(broker)
    assert sorted(by_key) == sorted(keys)
    for key, (_, body, headers) in zip(keys, items, strict=True):
        row = by_key[key]
        assert row["payload"] == body, key
        assert {k: row["headers"][k] for k in headers} == headers, key
    assert taker.ledger is not None
    assert sorted(r.msg_key for r in await taker.ledger.rows()) == sorted(keys)


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb", "sqlite"])
async def test_a_redelivery_after_sqlmq_archived_the_message_writes_nothing(
        broker: Broker, far_source: Far) -> None:
    """The inbox dies between its commit and its acknowledgements (its ack a no-op, its
    connection then closed); sqlmq handles and archives the messages, their keys free
    again; the far broker delivers them again (RabbitMQ at once, JetStream after the
    consumer's ack wait, Redis when another consumer claims them): nothing is written, and
    this time they are acknowledged. RabbitMQ's publisher then sends two of them again."""
    if far_source.kind == "nats":
        await ack_wait(far_source, "sqlmq-in", 1.0)
    keys = await far_source.publish([(f"k{i}", b"x%d" % i, {}) for i in range(20)])
    first = inbox(broker, far_source, consumer="first")

    async def lost(messages: Any) -> None:
        return None

    first.source.ack = lost  # type: ignore[method-assign]
    assert (await first.drain(idle=0.5)).taken == 20

    handled: list[str] = []

    @broker.subscriber("in")
    async def handle(msg: Message) -> None:
        handled.append(msg.payload.decode())

    await broker.start()
    await wait_until(lambda: drained(broker, "in"), message="sqlmq handled the messages")
    await broker.stop()
    assert sorted(handled) == sorted(f"x{i}" for i in range(20))
    assert len(await rows(broker, "archive", queue="in")) == 20

    second = await inbox(broker, far_source, consumer="second").drain(idle=3.0)
    assert (second.taken, second.duplicates) == (0, 20)
    if far_source.kind == "rabbitmq":
        await far_source.publish([("k3", b"x3", {}), ("k7", b"x7", {})])
        assert (await inbox(broker, far_source).drain(idle=0.5)).duplicates == 2
    assert await rows(broker, "message", queue="in") == []
    assert (await inbox(broker, far_source, consumer="third").drain(idle=2.0)).duplicates == 0
    assert len(keys) == 20


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_the_key_can_come_from_a_header_and_a_message_without_one_is_refused(
        broker: Broker, far_source: Far) -> None:
    """With ``key_header``, a message's key is that header's value (a Redis field), also in
    a batch of messages the far broker keys otherwise; one without it is refused (rejected,
    terminated, or acknowledged on Redis) and not written. With ``require_key=False`` such
    messages are taken, without a key."""
    items: list[Item] = [(None, b"a", {"order-id": "o-1"}), (None, b"b", {}),
                         (None, b"c", {"order-id": "o-3"})]
    if far_source.kind == "redis":
        items = [("o-1", b"a", {}), (None, b"b", {}), ("o-3", b"c", {})]
    header = "key" if far_source.kind == "redis" else "order-id"
    await far_source.publish(items)
    counts = await inbox(broker, far_source, key_header=header).drain(idle=0.5)
    assert (counts.taken, counts.refused) == (2, 1)
    assert {k: r["payload"] for k, r in (await taken(broker)).items()} == {"o-1": b"a",
                                                                          "o-3": b"c"}
    await far_source.publish([(None, b"d", {})])
    counts = await inbox(broker, far_source, key_header=header, require_key=False).drain(idle=0.5)
    assert counts.taken == 1
    assert (await taken(broker))[None]["payload"] == b"d"


@pytest.mark.parametrize("db_kind", ["sqlite"])
@pytest.mark.parametrize("source_kind", ["rabbitmq"])
async def test_far_headers_of_any_type_become_text(broker: Broker, far_source: Far) -> None:
    """AMQP header values of every type RabbitMQ carries become text: numbers and booleans
    as written, bytes as UTF-8 (base64 when they are not), times in ISO 8601, lists and
    tables as JSON; a header without a value is left out; the content type travels as
    sqlmq's ``content-type``."""
    import aio_pika

    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    await far_source.extra["channel"].default_exchange.publish(aio_pika.Message(
        b'{"id": 7}', message_id="m-1", content_type="application/json",
        headers={"s": "text", "i": 42, "f": 1.5, "yes": True, "raw": bytearray("café".encode()),
                 "bin": bytearray(b"\xff\x00"), "when": when, "list": [1, "a"], "table": {"k": 1},
                 "none": None}), routing_key=far_source.name)
    await inbox(broker, far_source).drain(idle=0.5)
    headers = (await taken(broker))["m-1"]["headers"]
    assert headers == {"s": "text", "i": "42", "f": "1.5", "yes": "true", "raw": "café",
                       "bin": "/wA=", "when": when.isoformat(),
                       "list": '[1,"a"]', "table": '{"k":1}',
                       "content-type": "application/json"}


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_the_inbox_runs_with_the_broker_it_is_added_to(broker: Broker,
                                                             far_source: Far) -> None:
    """``broker.add_middleware(inbox)``: started by ``broker.start()`` (which raises what
    stops the inbox's start), stopped gracefully by ``broker.stop()``."""
    taker = inbox(broker, far_source)
    broker.add_middleware(taker)
    await broker.start()
    try:
        keys = await far_source.publish([(f"k{i}", b"x", {}) for i in range(5)])
        await wait_until(lambda: _has(broker, 5), message="the inbox took the messages")
    finally:
        await broker.stop()
    assert taker._task is None and sorted(await taken(broker)) == sorted(keys)


async def _has(broker: Broker, n: int) -> bool:
    return len(await rows(broker, "message", queue="in")) == n


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb", "sqlite"])
async def test_the_ledger_takes_the_unseen_keys_of_a_batch_and_forgets_old_ones(
        broker: Broker) -> None:
    """A batch with keys the ledger has (an INSERT that collides) is written again without
    them, in one transaction; the first of a key met twice in one batch is taken. Pruning
    deletes the source's rows older than the retention in bounded batches, and no other
    source's."""
    from sqlmq.relay.source import FarMessage

    async def publish(conn: Any, messages: Any) -> Any:
        return await broker.publish_batch("in", [m.body for m in messages],
                                          dedup_keys=[m.key for m in messages],
                                          connection=conn)

    ledger = Ledger(broker.db, broker.schema, "test:a", timedelta(days=7))
    other = Ledger(broker.db, broker.schema, "test:b", timedelta(days=7))
    first = await ledger.write([FarMessage(f"k{i}", b"1", {}) for i in range(3)], publish)
    assert [m.key for m in first.taken] == ["k0", "k1", "k2"]
    batch = [FarMessage(k, b"2", {}) for k in ("k1", "k5", "k2", "k6", "k5")]
    second = await ledger.write(batch, publish)
    assert [m.key for m in second.taken] == ["k5", "k6"]
    assert sorted(m.key for m in second.duplicates) == ["k1", "k2", "k5"]
    assert second.taken[0] is batch[1]
    await other.write([FarMessage("k1", b"3", {})], publish)  # another source: its own
    # k1 of the other source is published too, as sqlmq's deduplication allows: k1 of
    # source a waits in the queue, so that publish found it and wrote nothing
    assert len(await rows(broker, "message", queue="in")) == 5

    t = broker.schema.inbox_seen
    old = datetime.now(UTC) - timedelta(days=8)
    async with broker.db.begin() as conn:
        await conn.execute(t.update().where(t.c.msg_key.in_(["k0", "k1", "k5"]))
                           .values(taken_at=old))
    assert await ledger.prune(batch=2, pause=0) == 3
    assert sorted(r.msg_key for r in await ledger.rows()) == ["k2", "k6"]
    assert [r.msg_key for r in await other.rows()] == ["k1"]


async def test_what_the_inbox_cannot_use_is_a_clear_error(tmp_path: Any) -> None:
    """``memory://`` has no table for the ledger; a URL of no broker, of a broker the inbox
    does not take from, without what to read, or where nothing answers, or without the
    queue or stream named: each says so, naming where (password masked)."""
    memory = Broker("memory://")
    with pytest.raises(ConfigurationError, match="needs a database for its ledger"):
        Inbox(memory, "in", source="amqp://127.0.0.1/", queue_name="q")
    broker = Broker(f"sqlite:///{tmp_path}/inbox.db")
    await broker.migrate()
    try:
        for source, options, error, fragment in [
            ("nowhere", {}, ConfigurationError, "is not a broker URL"),
            ("http://x", {}, ConfigurationError, "unknown broker URL scheme 'http'"),
            ("mqtt://127.0.0.1", {}, ConfigurationError, "takes from nats, rabbitmq, redis"),
            ("amqp://127.0.0.1", {}, ConfigurationError, "needs the queue to consume"),
            ("redis://127.0.0.1", {}, ConfigurationError, "needs the stream"),
        ]:
            with pytest.raises(error, match=fragment):
                Inbox(broker, "in", source=source, **options)
        for source, options, fragment in [
            ("amqp://guest:s3cret@127.0.0.1:1/", {"queue_name": "q"},
             r"cannot connect to RabbitMQ at amqp://guest:\*\*\*@127.0.0.1:1/"),
            ("nats://127.0.0.1:1", {"stream": "s"}, "cannot connect to NATS at"),
            ("redis://127.0.0.1:1/0", {"stream": "s"}, "cannot connect to Redis at"),
            ("amqp://guest:guest@127.0.0.1:5672/", {"queue_name": "sqlmq-no-such-queue"},
             "has no queue 'sqlmq-no-such-queue'"),
            ("nats://127.0.0.1:4222", {"stream": "sqlmq-no-such-stream"},
             "has no JetStream stream 'sqlmq-no-such-stream'"),
        ]:
            with pytest.raises(SourceUnavailable, match=fragment) as raised:
                await Inbox(broker, "in", source=source, connect_timeout=2,
                            **options).drain(idle=0.1)
            assert "s3cret" not in str(raised.value)
    finally:
        await broker.close()
        await memory.close()
