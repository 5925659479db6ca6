"""PostgreSQL's bulk publish: large batches on sqlmq's own connection go by binary COPY with
ids reserved from the table's sequence. These check what that path must keep from the
one-statement INSERT: ids in body order matching the rows, every column as the INSERT would
write it (database clock included), the NOTIFY at commit and only then, all or nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, ProgrammingError

from sqlmq import Broker, PayloadTooLarge, PublishError
from sqlmq.codec import CONTENT_TYPE, encode
from sqlmq.engines.postgresql.copy_publish import PG_COPY_MIN
from sqlmq.engines.postgresql.notify import channel_for
from sqlmq.publishing import prepare

from .conftest import PG_URL, counting_inserts, drop_tables, rows

BULK = max(PG_COPY_MIN, 600)


@pytest.fixture
def db_url() -> str:
    """Every test here runs on PostgreSQL only: COPY is its path alone."""
    return PG_URL


async def db_now(broker: Broker) -> datetime:
    async with broker.db.connect() as conn:
        return (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()


async def count(broker: Broker) -> int:
    async with broker.db.connect() as conn:
        return (await conn.execute(
            text(f"SELECT count(*) FROM {broker.schema.message.name}"))).scalar_one()


def mixed_bodies(n: int) -> list[Any]:
    """Three content types (so three header sets), empty and large payloads, non-ASCII."""
    out: list[Any] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(bytes([i % 256]) * (i % 700))  # includes b"" and > 256 KiB in all
        elif kind == 1:
            out.append(f"text {i} é \"\\ \u2603")
        elif kind == 2:
            out.append({"n": i, "s": "ü\n\t\"'"})
        else:
            out.append(bytearray(b"\x00\xff" * (i % 5)))
    return out


async def test_bulk_ids_are_in_body_order_and_match_the_rows(broker: Broker) -> None:
    bodies = mixed_bodies(BULK * 4)  # several COPY chunks
    headers = {"tenant": "é \"quoted\" \\ back", "n": "1"}
    before = await db_now(broker)
    with counting_inserts(broker.db.sync_engine) as inserts:
        ids = await broker.publish_batch("bulk-é", bodies, headers=headers)
    after = await db_now(broker)

    assert inserts == []  # it went by COPY
    assert len(ids) == len(bodies) and ids == sorted(ids) and len(set(ids)) == len(ids)
    by_id = {r["id"]: r for r in await rows(broker)}
    assert sorted(by_id) == ids
    for msg_id, body in zip(ids, bodies, strict=True):
        row = by_id[msg_id]
        payload, content_type = encode(body)
        assert row["payload"] == payload
        assert row["headers"] == {**headers, CONTENT_TYPE: content_type}
        assert row["queue"] == "bulk-é"
        assert row["state"] == "PENDING"
        assert (row["attempts_count"], row["deliveries_count"]) == (0, 0)
        assert row["first_attempt_at"] is None and row["last_attempt_at"] is None
        assert row["acquired_at"] is None and row["lease_expires_at"] is None
        assert row["last_error"] is None and row["history"] is None
    created = {r["created_at"] for r in by_id.values()}
    assert len(created) == 1  # one transaction, the database's now()
    (created_at,) = created
    assert before <= created_at <= after
    assert all(r["next_attempt_at"] == created_at for r in by_id.values())


async def test_bulk_delay_and_at_are_computed_like_the_insert(broker: Broker) -> None:
    ids = await broker.publish_batch("q", [b"d"] * BULK, delay=90.5)
    by_id = {r["id"]: r for r in await rows(broker)}
    assert {by_id[i]["next_attempt_at"] - by_id[i]["created_at"] for i in ids} == {
        timedelta(seconds=90.5)
    }
    at = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    ids = await broker.publish_batch("q", [b"a"] * BULK, at=at.astimezone(
        datetime.now().astimezone().tzinfo))
    assert {r["next_attempt_at"] for r in await rows(broker) if r["id"] in set(ids)} == {at}


async def test_bulk_and_small_batches_write_identical_rows(broker: Broker) -> None:
    bodies = mixed_bodies(PG_COPY_MIN)
    with counting_inserts(broker.db.sync_engine) as inserts:
        small = await broker.publish_batch("q", bodies[: PG_COPY_MIN - 1], headers={"h": "v"})
        bulk = await broker.publish_batch("q", bodies, headers={"h": "v"})
    assert len(inserts) == 1  # only the small one went as an INSERT
    by_id = {r["id"]: r for r in await rows(broker)}
    keep = ("queue", "headers", "payload", "state", "attempts_count", "deliveries_count",
            "first_attempt_at", "last_attempt_at", "acquired_at", "lease_expires_at",
            "last_error", "history")
    for a, b in zip(small, bulk, strict=False):
        assert {k: by_id[a][k] for k in keep} == {k: by_id[b][k] for k in keep}


async def test_concurrent_bulk_publishes_get_disjoint_ordered_ids(broker: Broker) -> None:
    batches = [[f"{n}:{i}" for i in range(BULK)] for n in range(4)]
    results = await asyncio.gather(*(broker.publish_batch("q", b) for b in batches))
    seen: set[int] = set()
    by_id = {r["id"]: r for r in await rows(broker)}
    for bodies, ids in zip(batches, results, strict=True):
        assert ids == sorted(ids) and not seen & set(ids)
        seen |= set(ids)
        assert [by_id[i]["payload"].decode() for i in ids] == bodies
    assert len(by_id) == 4 * BULK


async def listen(broker: Broker) -> tuple[asyncpg.Connection, asyncio.Queue[str]]:
    got: asyncio.Queue[str] = asyncio.Queue()
    conn = await asyncpg.connect(PG_URL)
    await conn.add_listener(channel_for(broker.schema), lambda *a: got.put_nowait(a[3]))
    return conn, got


async def test_bulk_publish_notifies_listeners_once_committed(broker: Broker) -> None:
    conn, got = await listen(broker)
    try:
        await broker.publish_batch("woken", [b"x"] * BULK)
        assert await asyncio.wait_for(got.get(), 5) == "woken"
        await asyncio.sleep(0.2)
        assert got.empty()  # one notification for the whole batch
    finally:
        await conn.close()


async def test_rejected_bodies_or_headers_insert_nothing(prefix: str) -> None:
    b = Broker(PG_URL, table_prefix=prefix, max_payload_bytes=1000)
    await b.migrate()
    conn, got = await listen(b)
    try:
        bodies: list[Any] = [b"ok"] * BULK + [b"x" * 1001]
        with pytest.raises(PayloadTooLarge, match="max_payload_bytes"):
            await b.publish_batch("q", bodies)
        with pytest.raises(PublishError, match="header"):
            await b.publish_batch("q", [b"ok"] * BULK, headers={"h": 1})  # type: ignore[dict-item]
        with pytest.raises(PublishError, match="NUL"):
            await b.publish_batch("q", [b"ok"] * BULK, headers={"h": "a\x00b"})
        with pytest.raises(PublishError, match="cannot encode"):
            await b.publish_batch("q", ["ok"] * BULK + [object()])
        assert await count(b) == 0
        await asyncio.sleep(0.2)
        assert got.empty()
    finally:
        await conn.close()
        await b.close()
        drop_tables(PG_URL, prefix)


async def test_a_copy_the_server_rejects_inserts_nothing_and_notifies_nobody(
    broker: Broker,
) -> None:
    async with broker.db.begin() as c:
        await c.execute(text(f"ALTER TABLE {broker.schema.message.name} ADD CONSTRAINT small "
                             "CHECK (octet_length(payload) < 100)"))
    conn, got = await listen(broker)
    try:
        bodies = [b"fine"] * BULK + [b"x" * 100]  # the last row fails, after the others
        with pytest.raises(IntegrityError, match="small"):  # as the INSERT would raise
            await broker.publish_batch("q", bodies)
        assert await count(broker) == 0
        await asyncio.sleep(0.2)
        assert got.empty()
        # The engine's next COPY works (the failed connection was not reused broken).
        ids = await broker.publish_batch("q", bodies[:-1])
        assert len(ids) == BULK and await count(broker) == BULK
        assert await asyncio.wait_for(got.get(), 5) == "q"
    finally:
        await conn.close()


async def test_the_outbox_keeps_large_batches_in_the_callers_transaction(
    broker: Broker,
) -> None:
    bodies = mixed_bodies(BULK)
    async with broker.db.connect() as conn:
        async with conn.begin() as tx:
            ids = await broker.publish_batch("q", bodies, connection=conn)
            assert len(ids) == BULK
            await tx.rollback()
    assert await count(broker) == 0
    async with broker.db.begin() as conn:
        ids = await broker.publish_batch("q", bodies, headers={"h": "é"}, connection=conn)
    with broker.sync_db.begin() as sync_conn:
        ids += broker.publish_batch_sync("q", bodies, headers={"h": "é"}, connection=sync_conn)
    by_id = {r["id"]: r for r in await rows(broker)}
    assert sorted(by_id) == ids
    for msg_id, body in zip(ids, bodies + bodies, strict=True):
        payload, content_type = encode(body)
        assert by_id[msg_id]["payload"] == payload
        assert by_id[msg_id]["headers"] == {"h": "é", CONTENT_TYPE: content_type}


@pytest.mark.parametrize("body", [
    b"", b"bytes", "", "text é \u2603", "lone \udc80 surrogate", bytearray(b"ba"),
    memoryview(b"mv"), {"a": [1, "é"]}, 3, None,
])
def test_prepare_encodes_like_the_codec(body: Any) -> None:
    (m,) = prepare("q", [body], headers=None, delay=None, at=None, max_payload_bytes=100)
    payload, content_type = encode(body)
    assert (m.payload, m.headers[CONTENT_TYPE]) == (payload, content_type)
    assert type(m.payload) is bytes


async def test_a_failure_while_streaming_inserts_nothing(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlmq.engines.postgresql.engine as pg

    real = pg.pg_copy_data

    async def broken(*args: Any) -> AsyncIterator[bytes]:
        async for chunk in real(*args):
            yield chunk[: len(chunk) // 2]  # the server has a partial stream
            raise RuntimeError("encoder broke")

    monkeypatch.setattr(pg, "pg_copy_data", broken)
    conn, got = await listen(broker)
    try:
        with pytest.raises(RuntimeError, match="encoder broke"):
            await broker.publish_batch("q", [b"x" * 200] * (BULK * 4))
        assert await count(broker) == 0
        monkeypatch.setattr(pg, "pg_copy_data", real)
        await broker.publish_batch("q", [b"x"] * BULK)
        assert await count(broker) == BULK
        assert await asyncio.wait_for(got.get(), 5) == "q"
        assert got.empty()
    finally:
        await conn.close()


async def test_a_cancelled_bulk_publish_is_all_or_nothing(broker: Broker) -> None:
    n = BULK * 40
    bodies = [b"x" * 100] * n
    for delay in (0.0, 0.01, 0.03, 0.06, 0.1, 0.2):  # before, during and after the COPY
        before = await count(broker)
        task = asyncio.create_task(broker.publish_batch("q", bodies))
        await asyncio.sleep(delay)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        after = await count(broker)
        assert after in (before, before + n)
        ids = await broker.publish_batch("q", [b"y"] * BULK)  # the engine still works
        assert len(ids) == BULK and await count(broker) == after + BULK


async def test_a_missing_table_fails_like_the_insert(prefix: str) -> None:
    b = Broker(PG_URL, table_prefix=prefix)  # never migrated
    try:
        for n in (1, BULK):
            with pytest.raises(ProgrammingError, match="does not exist"):
                await b.publish_batch("q", [b"x"] * n)
    finally:
        await b.close()
