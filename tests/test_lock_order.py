"""A flush and a lease renewal of the same rows lock them in one order (by id).

In a draining process the flush settles results in the order handlers finished, while the
lease keeper renews in the order messages were acquired; each statement locking its rows in
its own order, the two deadlocked (the database aborted one, and it was retried). Here a
third session holds the lower row, so that both statements are waiting when it lets go: in
different orders, the renewal then takes the lower row and waits for the higher, which the
flush took first. SQLite has no row locks (a writer holds the whole file), so it cannot
deadlock this way.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from sqlmq import Broker, Outcome, Settlement

from .conftest import wait_until


async def _lock_waits(broker: Broker, db_kind: str) -> int:
    """Sessions waiting for a row lock on this test's message table. MariaDB refreshes
    INNODB_TRX only when it was last read over 0.1 s ago: polled more often, it never
    changes, hence the callers' interval of 0.2 s."""
    m = broker.schema.message.name
    if db_kind == "postgresql":
        sql = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
               "AND pid <> pg_backend_pid() AND query LIKE :pattern")
    else:
        sql = ("SELECT count(*) FROM information_schema.INNODB_TRX "
               "WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE :pattern")
    async with broker.db.connect() as conn:
        return (await conn.execute(text(sql), {"pattern": f"%{m}%"})).scalar_one()


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_settle_and_lease_renewal_lock_the_same_rows_in_one_order(
    broker: Broker, db_kind: str
) -> None:
    await broker.publish_batch("q", [b"first", b"second"])
    low, high = sorted(await broker.engine.acquire(["q"], 10, 30.0), key=lambda d: d.id)
    m = broker.schema.message.name
    async with broker.db.connect() as blocker:
        await blocker.execute(text(f"SELECT id FROM {m} WHERE id = :id FOR UPDATE"),
                              {"id": low.id})
        renew = asyncio.create_task(broker.engine.extend(
            [(low.id, low.deliveries), (high.id, high.deliveries)], 30.0))
        await wait_until(lambda: _at(broker, db_kind, 1), interval=0.2,
                         message="the renewal waiting")
        flush = asyncio.create_task(broker.engine.settle([
            Settlement(high.id, high.deliveries, Outcome.COMPLETE),
            Settlement(low.id, low.deliveries, Outcome.COMPLETE),
        ]))
        await wait_until(lambda: _at(broker, db_kind, 2), interval=0.2,
                         message="the flush waiting too")
        await blocker.rollback()
    renewed, settled = await asyncio.gather(renew, flush, return_exceptions=True)
    assert not isinstance(renewed, BaseException), renewed
    assert not isinstance(settled, BaseException), settled
    assert renewed == {low.id, high.id}  # the renewal went first: it waited first
    assert settled == {low.id, high.id}


async def _at(broker: Broker, db_kind: str, n: int) -> bool:
    return await _lock_waits(broker, db_kind) >= n
