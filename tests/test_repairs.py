"""The archive repairs of the Broker API (``requeue``, ``purge``, ``delete``), which the CLI and
the dashboard call: 100k rows moved in batches with exact counts, an interrupt that leaves
whole batches done, and bad arguments refused before anything moves."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Integer, column, func, insert, literal, select, text

from sqlmq import Broker, ChannelFull, ConfigurationError, Outcome, Settlement
from tests.conftest import on_memory

BIG = 100_000


async def _archive(broker: Broker, queue: str, n: int, state: str, archived_at: datetime,
                   first_id: int) -> list[int]:
    """``n`` archived rows written straight into the archive table, in one INSERT … SELECT
    over a series of ids (the fast way to a big archive: publishing and failing 100k
    messages would be the test's whole budget)."""
    ids = list(range(first_id, first_id + n))
    if on_memory(broker):
        from sqlmq.engines.memory.engine import Archived

        store = broker.engine._store  # type: ignore[attr-defined]
        for i in ids:
            store.archive[i] = Archived(
                i, queue, {}, b'{"n": 1}', state, 1, 1, archived_at, None, None, archived_at,
                "boom", [])
        return ids
    a = broker.schema.archive
    lo, hi = ids[0], ids[-1]
    series = {  # the ids lo..hi, one per row, by the database's own means
        "postgresql": "SELECT generate_series(:lo, :hi) AS n",
        "mariadb": f"SELECT seq AS n FROM seq_{lo}_to_{hi}",  # its sequence engine
        "sqlite": "WITH RECURSIVE g(n) AS (SELECT :lo UNION ALL SELECT n + 1 FROM g "
                  "WHERE n < :hi) SELECT n FROM g",
    }[broker.db.dialect.name]
    src = text(series).columns(column("n", Integer))
    if ":lo" in series:
        src = src.bindparams(lo=lo, hi=hi)
    nums = src.subquery()
    at = literal(archived_at, a.c.archived_at.type)
    rows = select(nums.c.n, literal(queue), literal({}, a.c.headers.type),
                  literal(b'{"n": 1}', a.c.payload.type), literal(state), literal(1),
                  literal(1), at, at, literal("boom"), literal([], a.c.history.type))
    async with broker.db.begin() as conn:
        await conn.execute(insert(a).from_select(
            ["id", "queue", "headers", "payload", "state", "attempts_count",
             "deliveries_count", "created_at", "archived_at", "error", "history"], rows))
    return ids


async def _count(broker: Broker, table: str, **where: str) -> int:
    if on_memory(broker):
        store = broker.engine._store  # type: ignore[attr-defined]
        found = store.rows.values() if table == "message" else store.archive.values()
        return sum(all(getattr(r, k) == v for k, v in where.items()) for r in found)
    t = broker.schema.message if table == "message" else broker.schema.archive
    async with broker.db.connect() as conn:
        return (await conn.execute(select(func.count()).select_from(t).where(
            *(t.c[k] == v for k, v in where.items())))).scalar_one()


@pytest.mark.slow
@pytest.mark.parametrize("db_kind", ["memory", "sqlite", "postgresql", "mariadb"])
async def test_requeue_and_purge_of_100k_rows_count_exactly(broker: Broker) -> None:
    now = await broker.engine.now()
    old = now - timedelta(days=3)
    await _archive(broker, "big", BIG, "FAILED", now, 1)
    await _archive(broker, "other", 5, "FAILED", now, BIG + 1)
    seen: list[int] = []
    assert await broker.requeue(queue="big", batch=4000, progress=seen.append) == BIG
    # After each batch: 25 full ones, then the empty one that ends FAILED and CANCELLED's.
    assert seen == [*range(4000, BIG + 1, 4000), BIG, BIG]
    assert await _count(broker, "message", queue="big", state="PENDING") == BIG
    assert await _count(broker, "archive", queue="other") == 5
    assert await _count(broker, "archive", queue="big") == 0

    await _archive(broker, "done", BIG, "COMPLETED", old, 2 * BIG)
    await _archive(broker, "done", 7, "COMPLETED", now, 3 * BIG)
    assert await broker.purge(older_than=timedelta(days=1), batch=5000) == BIG
    assert await _count(broker, "archive", queue="done") == 7
    assert await _count(broker, "archive") == 12


@pytest.mark.parametrize("db_kind", ["memory", "sqlite", "postgresql", "mariadb"])
async def test_an_interrupted_requeue_leaves_whole_batches(broker: Broker) -> None:
    """Cancelled between batches, the requeue has moved exactly what it reported: nothing
    of the batch it was about to start, nothing half done."""
    await _archive(broker, "q", 1000, "FAILED", await broker.engine.now(), 1)
    task: asyncio.Task[int] | None = None
    reported: list[int] = []

    def progress(n: int) -> None:
        reported.append(n)
        if n >= 300 and task is not None:
            task.cancel()

    task = asyncio.ensure_future(broker.requeue(queue="q", batch=100, progress=progress))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert reported == [100, 200, 300]
    assert await _count(broker, "message", queue="q") == 300
    assert await _count(broker, "archive", queue="q") == 700
    assert await broker.requeue(queue="q") == 700  # the rest, once, on a second run


@pytest.mark.parametrize("db_kind", ["memory", "sqlite", "postgresql", "mariadb"])
async def test_a_requeue_that_would_overfill_a_channel_stops_at_the_batch_that_would(
        broker: Broker) -> None:
    """Dead letters of a channel come back under its max_size: the batches that fit move,
    the one that would overfill it moves nothing, and the error says how many moved."""
    await broker.set_channel("tenant", queue="q", max_size=10)
    sent = [await broker.publish("q", {"n": i}, channel="tenant") for i in range(8)]
    got = await broker.engine.acquire(["q"], 10, 30)
    assert await broker.engine.settle(
        [Settlement(d.id, d.deliveries, Outcome.FAIL, error="x") for d in got]) == set(sent)
    await broker.set_channel("tenant", max_size=5)
    seen: list[int] = []
    with pytest.raises(ChannelFull, match=r"channel 'tenant' holds 3 messages and its "
                                          r"max_size is 5: 3 more would exceed it.* 3 "
                                          r"requeued before it stay requeued"):
        await broker.requeue(queue="q", batch=3, progress=seen.append)
    assert seen == [3]
    assert await _count(broker, "message", queue="q") == 3
    assert await _count(broker, "archive", queue="q") == 5
    with pytest.raises(ChannelFull, match="2 requeued before it"):  # what fits, in batches
        await broker.requeue(queue="q", batch=2)
    assert await _count(broker, "message", queue="q") == 5


@pytest.mark.parametrize("db_kind", ["memory", "sqlite", "postgresql", "mariadb"])
async def test_delete_and_filters(broker: Broker) -> None:
    now = await broker.engine.now()
    failed = await _archive(broker, "q", 3, "FAILED", now, 1)
    cancelled = await _archive(broker, "q", 2, "CANCELLED", now, 10)
    done = await _archive(broker, "q", 2, "COMPLETED", now, 20)
    live = await broker.publish("q", {"live": True})
    assert await broker.delete(failed[0]) is True
    assert await broker.delete(failed[0]) is False
    assert await broker.delete(live) is False  # live messages are cancelled, not deleted
    assert await _count(broker, "message", queue="q") == 1
    # The default states of a requeue are the dead letters: FAILED and CANCELLED.
    assert await broker.requeue(ids=[failed[1], cancelled[0], done[0]]) == 2
    assert await broker.purge(queue="q", states=["COMPLETED"]) == 2
    assert await broker.purge(ids=[cancelled[1]]) == 1
    assert await _count(broker, "archive", queue="q") == 1  # failed[2]
    assert await broker.purge(older_than=timedelta(hours=1)) == 0


@pytest.mark.parametrize("db_kind", ["memory", "sqlite"])
async def test_bad_arguments_move_nothing(broker: Broker) -> None:
    await _archive(broker, "q", 3, "FAILED", datetime.now(UTC), 1)
    for call, reason in (
        (broker.requeue(), "needs ids, a queue or an archive search"),
        (broker.requeue(queue="q", states=["PENDING"]), "no archived state PENDING"),
        (broker.requeue(queue="q", batch=0), "batch must be 1 to 100000"),
        (broker.purge(older_than=-5), "older_than must be zero or more"),
        (broker.purge(older_than="7d"), "older_than must be a timedelta or seconds"),
        (broker.purge(queue="q\x00"), "queue name must not contain NUL"),
    ):
        with pytest.raises(ConfigurationError, match=reason):
            await call
    assert await _count(broker, "archive", queue="q") == 3
