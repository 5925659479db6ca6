"""A stream's driver SIGKILLed between any two statements of leasing (ahead), acknowledging
and the sequence updates, then restarted on its checkpoint: at every moment each message
PROCESSING for the stream has its lease row (so a restart finds it), and the restart replays
or releases every uncommitted sequence at once: each message reaches the sink exactly once
and is archived COMPLETED once, with nothing left PROCESSING under the 600 s lease.

The driver is :mod:`tests.spark.microbatch`, which calls the source as Spark's micro-batch
engine does, in a subprocess that kills itself at a named point (``SQLMQ_TEST_FAULT``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import and_, select

from sqlmq import Broker

from ..conftest import rows, wait_until
from ..procs import ROOT
from . import microbatch

# No JVM runs here (the driver stands in for Spark's engine), so these tests are not marked
# ``spark``: they run in the parallel pass, beside the other crash tests.

MESSAGES = 23  # five batches of up to five

# Each case: the fault of each killed run, in order; a last run without a fault finishes.
# ``point:n`` kills at the n-th pass. Leasing: the 3rd lease is the one ahead of batch 1
# (batch 0 committed, batch 1's offset returned but not logged yet). Acknowledging: the
# 1st acknowledgement (of sequence 0) has nothing to archive, the 2nd archives batch 0;
# ``ack:settled`` is passed once per chunk archived on MySQL/SQLite, once per
# acknowledgement on PostgreSQL.
EVERY_DATABASE = [
    ("lease:owned:3",), ("lease:taken:3",), ("lease:recorded:3",), ("lease:committed:3",),
    ("lease:taken:1",), ("lease:committed:2",),
    ("ack:settled:2",), ("ack:sequenced:2",), ("ack:committed:2",),
    ("spark:planned:2",), ("spark:written:2",),
    # restart-only points: the first kill leaves sequence 2 unlogged and 3 leased ahead
    ("lease:committed:3", "sweep:released"), ("lease:committed:3", "sweep:deleted"),
    ("lease:committed:3", "reuse:extended"),
    ("spark:written:2", "spark:written:1"),  # killed again while replaying
]
# MySQL/MariaDB and SQLite acquire in several statements, and acknowledge in two steps.
STATEMENT_BY_STATEMENT = [
    ("lease:locked:3",), ("lease:inserted:3",), ("ack:read:2",), ("ack:settled:1",),
    ("ack:deleted:2",),
]


def cases() -> list[tuple[str, tuple[str, ...]]]:
    """(database, faults): every point on every database it exists on. PostgreSQL leases in
    one statement and acknowledges in one transaction, so the statement-by-statement points
    are never passed there."""
    return [
        *((db, f) for db in ("sqlite", "postgresql", "mariadb") for f in EVERY_DATABASE),
        *((db, f) for db in ("sqlite", "mariadb") for f in STATEMENT_BY_STATEMENT),
    ]


class Drivers:
    """Starts drivers through one ``microbatch --serve`` process per test process, which
    forks each from an interpreter that has pyspark and sqlmq imported already."""

    def __init__(self) -> None:
        self.server = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.microbatch", "--serve"], cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )
        self.lock = threading.Lock()

    def run(self, db_url: str, prefix: str, tmp: Path, fault: str | None) -> int:
        """One driver run to its end (or its fault point); its exit code."""
        assert self.server.stdin is not None and self.server.stdout is not None
        request = [db_url, prefix, str(tmp / "ck"), str(tmp / "out"),
                   str(tmp / "driver.log"), fault]
        with self.lock:
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            answer = self.server.stdout.readline()
        assert answer, f"the driver server ended (exit {self.server.poll()})"
        return int(answer)

    def close(self) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()


@pytest.fixture(scope="module")
def drivers() -> Iterator[Drivers]:
    d = Drivers()
    try:
        yield d
    finally:
        d.close()


async def unrecorded(broker: Broker) -> list[int]:
    """Messages PROCESSING with no lease row of their delivery: recorded nowhere, they
    would wait for their 600 s lease to expire."""
    m, lt = broker.schema.message, broker.schema.spark_lease
    stmt = (
        select(m.c.id).select_from(m.outerjoin(lt, and_(
            lt.c.id == m.c.id, lt.c.deliveries == m.c.deliveries_count,
            lt.c.consumer == microbatch.CONSUMER)))
        .where(m.c.queue == microbatch.QUEUE, m.c.state == "PROCESSING", lt.c.id.is_(None))
    )
    async with broker.db.connect() as conn:
        return list((await conn.execute(stmt)).scalars())


async def archived_but_held(broker: Broker) -> list[int]:
    """Messages archived while their lease row stays: the archive, the lease rows and the
    acknowledged sequence must move in one transaction."""
    a, lt = broker.schema.archive, broker.schema.spark_lease
    stmt = select(lt.c.id).select_from(lt.join(a, and_(
        a.c.id == lt.c.id, a.c.deliveries_count == lt.c.deliveries)))
    async with broker.db.connect() as conn:
        return list((await conn.execute(stmt)).scalars())


async def name_free(broker: Broker) -> bool:
    """The dead driver's heartbeat has gone stale (a restart may claim the name)."""
    c = broker.schema.spark_consumer
    async with broker.db.connect() as conn:
        row = (await conn.execute(select(c.c.heartbeat_at))).first()
    if row is None or row[0] is None:
        return True
    age = (await broker.engine.now()) - row[0]
    return age.total_seconds() > microbatch.CONSUMER_TIMEOUT


@pytest.mark.parametrize(("db_kind", "faults"), cases(),
                         ids=[f"{db}-{'+'.join(f)}" for db, f in cases()])
async def test_killed_driver_restarts_and_every_message_is_read_and_archived_once(
    broker: Broker, db_url: str, prefix: str, db_kind: str, tmp_path: Path,
    faults: tuple[str, ...], drivers: Drivers,
) -> None:
    ids = await broker.publish_batch(microbatch.QUEUE, [{"n": i} for i in range(MESSAGES)])
    for fault in faults:
        code = await asyncio.to_thread(drivers.run, db_url, prefix, tmp_path, fault)
        log = (tmp_path / "driver.log").read_text(errors="replace")[-3000:]
        assert code == -signal.SIGKILL, f"{fault} never reached (exit {code}): {log}"
        assert await unrecorded(broker) == []
        assert await archived_but_held(broker) == []
        await wait_until(lambda: name_free(broker), timeout=30, message="a stale heartbeat")

    code = await asyncio.to_thread(drivers.run, db_url, prefix, tmp_path, None)
    log = (tmp_path / "driver.log").read_text(errors="replace")[-3000:]
    assert code == 0, log

    out = tmp_path / "out"
    read = [x for f in sorted(out.glob("batch-*")) for x in json.loads(f.read_text())]
    assert Counter(read) == Counter(ids)  # every message reached the sink, once
    archived = await rows(broker, "archive")
    assert sorted(r["id"] for r in archived) == ids
    assert {r["state"] for r in archived} == {"COMPLETED"}
    assert await rows(broker) == []  # nothing left PROCESSING, PENDING or RETRYABLE
    async with broker.db.connect() as conn:
        assert (await conn.execute(select(broker.schema.spark_lease))).all() == []
