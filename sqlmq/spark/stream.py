"""Consuming a queue as a Spark stream, acknowledging only what Spark has committed.

Offsets are a per-consumer *lease sequence*, not message ids: ids acquired with SKIP LOCKED
are not contiguous when other consumers share the queue. Planning batch ``n`` acquires up
to ``maxMessagesPerBatch`` messages with the engine's acquire statements (a normal, fenced
delivery with a long lease) and records them in ``spark_lease`` as sequence ``n``, in one
transaction on every database (a crash between the two would leave messages acquired and
recorded nowhere until their lease expired); the partitions carry those ids, and
``read()`` only reads them, so a retried task or a replay after a restart returns the same
rows. Sequence ``n`` is archived COMPLETED (the engine's fenced settle) once Spark
has committed it: when it calls ``latestOffset(start=n)`` or ``commit(n)``, on a background
thread so that Spark runs the next batch meanwhile (a query that finds nothing new waits for
it). On restart, the sequence right after Spark's last logged offset is reused, and any
leased further ahead (never logged) is released at once (:meth:`Consumer.release_unlogged`).

The driver keeps a heartbeat on the consumer row (one running query per consumer name) and
extends the leases it holds, so they outlive a restart as long as the restart comes within
``leaseSeconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from sqlalchemy import delete, func, insert, literal, select, text, update
from sqlalchemy.exc import IntegrityError

from ..errors import ConfigurationError, SqlmqError
from ..records import Settlement
from ..sqltime import db_now_plus
from ..states import Outcome
from ..subscriber import check_queue
from .columns import MESSAGE_COLUMNS, epoch_us, record_batch
from .options import Database, Options, queue_option

log = logging.getLogger("sqlmq.spark")
T = TypeVar("T")

_ACQUIRE_CHUNK = 10_000
#: Default most rows per partition of a micro-batch. Each Spark task has a fixed cost far
#: above reading a few thousand rows: at local[2], 50,000-row batches ran about twice as
#: fast in two partitions as in five.
ROWS_PER_PARTITION = 25_000

#: Test-only fault injection. ``SQLMQ_TEST_FAULT=<point>`` or ``<point>:<n>`` makes this
#: process SIGKILL itself the n-th time (default: the first) it passes the named point, so
#: that crash tests can kill a driver between any two statements of leasing,
#: acknowledging and the sequence updates (tests/spark/test_stream_faults.py). Read once at
#: import; unset, as everywhere outside those tests, a point costs one comparison.
_FAULT = os.environ.get("SQLMQ_TEST_FAULT") or None
_fault_hits: list[str] = []


def _fault(point: str) -> None:
    """Die here if the crash test asked for it (see ``_FAULT``)."""
    if _FAULT is None or not _FAULT.startswith(point):
        return
    nth = _FAULT[len(point):]
    if nth not in ("", ":") and not (nth[0] == ":" and nth[1:].isdigit()):
        return  # another point whose name starts with this one's
    _fault_hits.append(point)  # list.append is atomic: points are passed on two threads
    if len(_fault_hits) == int(nth[1:] or 1):
        os.kill(os.getpid(), signal.SIGKILL)


class ConsumerBusy(SqlmqError):
    """Another running query holds this consumer name."""


@dataclass(frozen=True)
class StreamOptions:
    db: Database
    queue: str
    consumer: str
    max_per_batch: int | None
    lease: float
    consumer_timeout: float
    rows_per_partition: int


def stream_options(opts: Options) -> StreamOptions:
    db = Database.from_options(opts)
    queue = queue_option(opts, required=True)
    assert queue is not None
    consumer = opts.require("consumer", "orders-to-parquet")
    try:
        check_queue(consumer)
    except ConfigurationError as exc:
        raise ConfigurationError(f"option 'consumer': {exc}") from None
    if (opts.get("table") or "message").lower() not in ("message", "queue"):
        raise ConfigurationError(
            "a stream consumes the live queue; option 'table' = 'archive' is for batch reads"
        )
    timeout = opts.seconds("consumerTimeout", 30.0)
    lease = opts.seconds("leaseSeconds", 600.0)
    if lease < 3 * timeout:
        raise ConfigurationError(
            f"option 'leaseSeconds' ({lease:g}) must be at least 3 x 'consumerTimeout' "
            f"({timeout:g}) so that leases outlive a restart"
        )
    db.check()
    return StreamOptions(
        db=db, queue=queue, consumer=consumer,
        max_per_batch=opts.integer("maxMessagesPerBatch", 10_000),
        lease=lease, consumer_timeout=timeout,
        rows_per_partition=opts.integer("rowsPerPartition", ROWS_PER_PARTITION)
        or ROWS_PER_PARTITION,
    )


class LeasedIds(InputPartition):
    """The messages of one partition of a leased sequence, with the delivery each was read
    under (the stream shows those, not whatever the row says later)."""

    def __init__(self, ids: list[int], deliveries: list[int], attempts: list[int]) -> None:
        super().__init__(len(ids))
        self.ids = ids
        self.deliveries = deliveries
        self.attempts = attempts


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: leases and acknowledgements. Executor side: :meth:`read` only."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._consumer: Consumer | None = None
        self._budget: int | None = None
        self._available_now = False

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_consumer": None, "_budget": None,
                "_available_now": False}

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.options)
        return self._consumer

    def initialOffset(self) -> dict:
        return {"seq": self.consumer.acked_seq()}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_per_batch
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # "Available now" = what is ready when the first batch is planned, counted after
        # what a previous run left leased ahead is given back (release_unlogged); later
        # publishes wait for the next run.
        self._available_now = True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        c = self.consumer
        c.release_unlogged(start["seq"])
        if self._available_now and self._budget is None:
            self._budget = c.ready_count()
        n = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self._budget is not None:
            n = self._budget if n is None else min(n, self._budget)
        end, fresh = c.lease_next(start["seq"], n)
        if self._budget is not None:
            self._budget = max(0, self._budget - fresh)
            n = None if n is None else min(n, self._budget)
        if end > start["seq"] and n:
            c.lease_ahead(end, n)  # while Spark runs this batch
        # Spark calls this only once the batch ending at ``start`` is in its commit log: its
        # messages can be archived, while Spark runs the next batch. Queued after the lease
        # ahead, which the next call waits for; this one it does not.
        c.acknowledge_later(start["seq"])
        if end == start["seq"]:
            c.wait_acks()  # nothing new: leave nothing committed unacknowledged
        return {"seq": end}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        rows = self.consumer.leased(start["seq"], end["seq"])
        # As few partitions as rowsPerPartition allows, of equal size (50,001 rows at 25,000
        # are three partitions of 16,667, not two full ones and a straggler of one row).
        parts = max(1, -(-len(rows) // self.options.rows_per_partition))
        size = max(1, -(-len(rows) // parts))
        return [
            LeasedIds([r[0] for r in chunk], [r[1] for r in chunk], [r[2] for r in chunk])
            for chunk in (rows[i : i + size] for i in range(0, len(rows), size))
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, LeasedIds)
        yield from read_leased(self.options.db, partition)

    def commit(self, end: dict) -> None:
        # Spark calls this right after the latestOffset that already acknowledged ``end``
        # (see there); waiting here would hold up the next batch.
        self.consumer.acknowledge_later(end["seq"])

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def read_leased(db: Database, part: LeasedIds) -> Iterator[Any]:
    """The leased messages, read only: payload and headers never change, and the delivery
    columns come from the lease, so every read of a partition returns the same rows."""
    s = db.schema
    m, a = s.message, s.archive
    n = len(part.ids)
    given = {
        "state": ["PROCESSING"] * n, "attempts": part.attempts, "deliveries": part.deliveries,
        "next_attempt_at": [None] * n, "lease_expires_at": [None] * n,
    }
    engine = db.engine()
    if engine.dialect.name == "postgresql":
        # One statement for the whole partition, in the order of the lease: the ids travel
        # as one array literal (parsed by the server), timestamps as epoch microseconds.
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(_READ_LEASED.format(m=m.name, a=a.name),
                                        ("{" + ",".join(map(str, part.ids)) + "}",)).all()
        if len(rows) < n:
            found = {r[0] for r in rows}
            lost = [x for x in part.ids if x not in found]
            raise SqlmqError(f"leased messages {lost[:10]} are gone from {m.name} and {a.name}")
        yield record_batch(_LEASED_NAMES, rows, MESSAGE_COLUMNS, given)
        return
    by_id: dict[int, Any] = {}
    with db.engine().connect() as conn:
        for i in range(0, len(part.ids), 1000):
            chunk = part.ids[i : i + 1000]
            for table, error in ((m, m.c.last_error), (a, a.c.error)):
                wanted = [x for x in chunk if x not in by_id]
                if not wanted:
                    break
                stmt = select(
                    table.c.id, table.c.queue, table.c.headers, table.c.payload,
                    table.c.created_at, table.c.first_attempt_at, table.c.last_attempt_at,
                    error.label("error"),
                ).where(table.c.id.in_(wanted))
                for row in conn.execute(stmt).all():
                    by_id[row[0]] = tuple(row)
    lost = [x for x in part.ids if x not in by_id]
    if lost:
        raise SqlmqError(f"leased messages {lost[:10]} are gone from {m.name} and {a.name}")
    yield record_batch(_LEASED_NAMES, [by_id[x] for x in part.ids], MESSAGE_COLUMNS, given)


_LEASED_NAMES = ["id", "queue", "headers", "payload", "created_at", "first_attempt_at",
                 "last_attempt_at", "error"]

# A message is in exactly one of the two tables in the statement's snapshot (settling moves
# it in one statement), so the UNION ALL returns each leased id once. Headers come as JSON
# text, parsed once per distinct text (see record_batch).
_READ_LEASED = f"""
WITH w AS (SELECT id, o FROM unnest(CAST(CAST(%s AS TEXT) AS BIGINT[])) WITH ORDINALITY
           AS w(id, o))
SELECT id, queue, headers, payload, created_at, first_attempt_at, last_attempt_at, error
FROM (
    SELECT w.o, m.id, m.queue, CAST(m.headers AS TEXT) AS headers, m.payload,
        {epoch_us("m.created_at")} AS created_at,
        {epoch_us("m.first_attempt_at")} AS first_attempt_at,
        {epoch_us("m.last_attempt_at")} AS last_attempt_at, m.last_error AS error
    FROM w JOIN {{m}} AS m ON m.id = w.id
    UNION ALL
    SELECT w.o, a.id, a.queue, CAST(a.headers AS TEXT), a.payload, {epoch_us("a.created_at")},
        {epoch_us("a.first_attempt_at")}, {epoch_us("a.last_attempt_at")}, a.error
    FROM w JOIN {{a}} AS a ON a.id = w.id
) AS x
ORDER BY o
"""


class LoopThread:
    """An asyncio loop on a daemon thread, for the engine's async contract from sync code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sqlmq-spark-loop",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class Consumer:
    """The driver's hold on one consumer name: ownership, leases and acknowledgements."""

    def __init__(self, options: StreamOptions) -> None:
        from ..broker import Broker

        self.o = options
        self.db = options.db
        self.s = options.db.schema
        self.token = uuid.uuid4().hex
        self._lost: str | None = None
        self._io = LoopThread()
        self._broker = Broker(self.db.url, table_prefix=self.db.prefix)
        self._ahead: Future[int] | None = None
        self._ahead_seq = 0
        # One thread, so acknowledgements and leases ahead run one at a time, in order.
        self._ahead_pool = ThreadPoolExecutor(1, thread_name_prefix="sqlmq-spark-ahead")
        self._acks: list[Future[None]] = []
        self._acked_upto = -1  # the highest sequence handed to acknowledge_later
        # (id, deliveries, attempts) of sequences just leased, by sequence, sorted like
        # _leases: partitions() takes them instead of reading spark_lease back.
        self._fresh: dict[int, list[tuple[int, int, int]]] = {}
        self._cap: int | None = None  # see _take_cap
        self._swept = False  # see release_unlogged
        self.claim()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self._keeper = threading.Thread(target=self._keep, name="sqlmq-spark-keeper",
                                        daemon=True)
        self._keeper.start()
        _release_on_sigterm(self)

    # ---- ownership -----------------------------------------------------------------------

    def claim(self) -> None:
        """Own the consumer row, waiting for a previous owner's heartbeat to go stale (a
        restarted query's old driver process may not have released it)."""
        timeout = self.o.consumer_timeout
        deadline = time.monotonic() + timeout * 4 / 3
        while True:
            try:
                age = self._try_claim()
            except IntegrityError:  # another query inserted the row first
                age = 0.0
            if age is None:
                return
            if time.monotonic() > deadline:
                raise ConsumerBusy(
                    f"consumer {self.o.consumer!r} (queue {self.o.queue!r}) is held by another "
                    f"running query (heartbeat {age:.1f}s ago); stop that query or use another "
                    "option('consumer', ...)"
                )
            time.sleep(min(1.0, timeout / 5))

    def _try_claim(self) -> float | None:
        c = self.s.spark_consumer
        with self.db.engine().begin() as conn:
            now = conn.execute(select(db_now_plus(literal(0.0)))).scalar_one()
            row = conn.execute(
                select(c).where(c.c.consumer == self.o.consumer).with_for_update()
            ).first()
            if row is None:
                conn.execute(insert(c).values(
                    consumer=self.o.consumer, queue=self.o.queue, owner=self.token,
                    heartbeat_at=now, leased_seq=0, acked_seq=0,
                ))
                return None
            if row.owner not in (None, self.token) and row.heartbeat_at is not None:
                age = (now - row.heartbeat_at).total_seconds()
                if age < self.o.consumer_timeout:
                    return age
            if row.queue != self.o.queue and row.leased_seq > row.acked_seq:
                raise ConfigurationError(
                    f"consumer {self.o.consumer!r} still holds unacknowledged messages of queue "
                    f"{row.queue!r}; it cannot switch to {self.o.queue!r} (use another name)"
                )
            conn.execute(update(c).where(c.c.consumer == self.o.consumer).values(
                owner=self.token, heartbeat_at=now, queue=self.o.queue))
        return None

    def beat(self) -> None:
        c = self.s.spark_consumer
        with self.db.engine().begin() as conn:
            done = conn.execute(
                update(c).where(c.c.consumer == self.o.consumer, c.c.owner == self.token)
                .values(heartbeat_at=db_now_plus(literal(0.0)))
            ).rowcount
        if not done:
            self._lost = (f"consumer {self.o.consumer!r} was taken over by another query "
                          "(this driver missed its heartbeats)")

    def _check(self) -> None:
        if self._lost:
            raise ConsumerBusy(self._lost)

    def _keep(self) -> None:
        """Heartbeat every consumerTimeout/3; extend held leases and recover expired ones
        (of crashed consumers) every leaseSeconds/6."""
        beat_every = self.o.consumer_timeout / 3
        extend_every = self.o.lease / 6
        last_extend = time.monotonic()
        while not self._closed.wait(beat_every):
            try:
                self.beat()
                if time.monotonic() - last_extend >= extend_every:
                    last_extend = time.monotonic()
                    self.extend()
                    self._io.run(self._broker.engine.recover_expired(1000))
            except Exception as exc:
                log.warning("sqlmq stream %s: keeper failed: %s", self.o.consumer, exc)

    def close(self) -> None:
        """Give the name back so a restart does not wait for the heartbeat to go stale.
        Safe to call from two threads (the SIGTERM release and Spark's ``stop()``): the
        second call returns once the first is done."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._close()
        _open.discard(self)

    def _close(self) -> None:
        with contextlib.suppress(Exception):
            self.wait_acks()
        self._closed.set()
        self._lost = self._lost or "the stream is stopping"  # no new leases from here
        c = self.s.spark_consumer
        with contextlib.suppress(Exception), self.db.engine().begin() as conn:
            conn.execute(update(c).where(c.c.consumer == self.o.consumer,
                                         c.c.owner == self.token).values(owner=None))
        self._ahead_pool.shutdown(wait=False)
        with contextlib.suppress(Exception):
            self._io.run(self._broker.close())
        self._io.close()

    # ---- sequences -----------------------------------------------------------------------

    def acked_seq(self) -> int:
        c = self.s.spark_consumer
        with self.db.engine().connect() as conn:
            return conn.execute(
                select(c.c.acked_seq).where(c.c.consumer == self.o.consumer)
            ).scalar_one()

    def ready_count(self) -> int:
        m = self.s.message
        with self.db.engine().connect() as conn:
            return conn.execute(
                select(func.count()).select_from(m).where(
                    m.c.queue == self.o.queue,
                    m.c.next_attempt_at <= db_now_plus(literal(0.0)),
                )
            ).scalar_one()

    def _leases(self, conn: Any, *where: Any) -> list[tuple[int, int, int]]:
        lt = self.s.spark_lease
        stmt = select(lt.c.id, lt.c.deliveries, lt.c.attempts).where(
            lt.c.consumer == self.o.consumer, *where).order_by(lt.c.id)
        return [tuple(r) for r in conn.execute(stmt)]  # type: ignore[misc]

    def leased(self, start: int, end: int) -> list[tuple[int, int, int]]:
        self._check()
        if end == start + 1:
            # Usually leased on the background thread moments ago: no need to read it back.
            fresh = self._fresh.pop(end, None)
            if fresh is not None:
                return fresh
        lt = self.s.spark_lease
        with self.db.engine().connect() as conn:
            return self._leases(conn, lt.c.seq > start, lt.c.seq <= end)

    def acknowledge(self, upto: int) -> None:
        """Archive COMPLETED every message of sequences ``<= upto`` (committed by Spark)."""
        self._check()
        if self.db.engine().dialect.name == "postgresql":
            self._acknowledge_pg(upto)
            return
        lt, c = self.s.spark_lease, self.s.spark_consumer
        complete = (self._complete_sqlite if self.db.engine().dialect.name == "sqlite"
                    else self._complete_mysql)
        landed = 0
        # One transaction, as on PostgreSQL: the archive, the lease rows and the sequence
        # move together, so a crash leaves the sequence wholly acknowledged or not at all
        # (and the restarted query acknowledges it again: Spark committed it). The
        # consumer row first, as when leasing.
        with self.db.engine().begin() as conn:
            conn.execute(update(c).where(c.c.consumer == self.o.consumer, c.c.acked_seq < upto)
                         .values(acked_seq=upto))
            _fault("ack:sequenced")
            held = self._leases(conn, lt.c.seq <= upto)
            _fault("ack:read")
            for i in range(0, len(held), 5000):
                landed += complete(conn, held[i : i + 5000])
                _fault("ack:settled")
            conn.execute(delete(lt).where(lt.c.consumer == self.o.consumer, lt.c.seq <= upto))
            _fault("ack:deleted")
        _fault("ack:committed")
        if landed < len(held):
            log.warning("sqlmq stream %s: %d of %d committed messages had lost their lease "
                        "(delivered again elsewhere)", self.o.consumer, len(held) - landed,
                        len(held))

    def _complete_sqlite(self, conn: Any, held: list[tuple[int, int, int]]) -> int:
        """SQLite: the engine's fenced COMPLETE settle, in ``conn``'s transaction."""
        from ..engines.base import SqlEngine
        from ..engines.sqlite import archive_statements

        archive, remove = archive_statements(self.s.names)
        batch = {"input": SqlEngine.settlement_json(
            [Settlement(x, d, Outcome.COMPLETE) for x, d, _ in held])}
        conn.exec_driver_sql(archive, batch)
        return len(conn.exec_driver_sql(remove, batch).all())

    def _complete_mysql(self, conn: Any, held: list[tuple[int, int, int]]) -> int:
        """MySQL/MariaDB: the engine's fenced COMPLETE settle, in ``conn``'s transaction
        (its rows locked in id order, like the engine's)."""
        from ..engines.base import SqlEngine
        from ..engines.mysql import archive_statements

        put, lock, archive, remove, clear = archive_statements(self.s.names)
        ordered = sorted(held)
        conn.exec_driver_sql(put, (SqlEngine.settlement_json(
            [Settlement(x, d, Outcome.COMPLETE) for x, d, _ in ordered]),))
        landed = len(conn.exec_driver_sql(lock).all())
        conn.exec_driver_sql(archive)
        conn.exec_driver_sql(remove)
        conn.exec_driver_sql(clear)
        return landed

    def _acknowledge_pg(self, upto: int) -> None:
        """PostgreSQL: the lease rows feed the engine's fenced COMPLETE settle in one
        statement, in the transaction that records ``acked_seq``: nothing travels to this
        process, and the archive, the lease rows and the sequence move together."""
        c = self.s.spark_consumer
        stmt = text(_ACK_PG.format(lease=self.s.spark_lease.name, **self.s.names))
        with self.db.engine().begin() as conn:
            held, landed = conn.execute(stmt, {"consumer": self.o.consumer,
                                               "upto": upto}).one()
            _fault("ack:settled")
            conn.execute(update(c).where(c.c.consumer == self.o.consumer, c.c.acked_seq < upto)
                         .values(acked_seq=upto))
            _fault("ack:sequenced")
        _fault("ack:committed")
        if landed < held:
            log.warning("sqlmq stream %s: %d of %d committed messages had lost their lease "
                        "(delivered again elsewhere)", self.o.consumer, held - landed, held)

    def acknowledge_later(self, upto: int) -> None:
        """:meth:`acknowledge` on the background thread, after whatever it is doing. A
        failed acknowledgement is retried by the next one, which covers every sequence up
        to its own."""
        self.wait_acks(block=False)
        for seq in [k for k in list(self._fresh) if k <= upto]:
            self._fresh.pop(seq, None)
        if upto > self._acked_upto:
            self._acked_upto = upto
            self._acks.append(self._ahead_pool.submit(self.acknowledge, upto))

    def wait_acks(self, block: bool = True) -> None:
        """Wait for (or, without ``block``, collect the finished) background
        acknowledgements; raise :class:`ConsumerBusy` if one found the name taken."""
        pending = []
        for f in self._acks:
            if not block and not f.done():
                pending.append(f)
                continue
            try:
                f.result()
            except ConsumerBusy:
                raise
            except Exception as exc:
                self._acked_upto = -1  # so that even an idle query's next call retries it
                log.warning("sqlmq stream %s: acknowledging failed (retried with the next "
                            "call): %s", self.o.consumer, exc)
        self._acks = pending

    def lease_ahead(self, last: int, limit: int) -> None:
        """Lease sequence ``last + 1`` in the background, so that the next ``latestOffset``
        finds it ready. Until Spark logs it, it is an ordinary orphan lease: renewed by the
        keeper and reused after a restart."""
        self._ahead_seq = last + 1
        self._ahead = self._ahead_pool.submit(self._lease_fresh, last + 1, limit)

    def release_unlogged(self, start: int) -> None:
        """Once per run, at the first planning: give back the messages of sequences past
        ``start + 1``. Spark logs each offset it plans before it asks for the next one, so
        those sequences were leased ahead by a run that died before Spark logged the batch
        before them, and no replay will read them (``start + 1`` itself is reused by
        :meth:`lease_next`). Left alone they would sit PROCESSING until their lease
        expired, or be acknowledged with a later sequence without ever being read. Released
        without a refund: the delivery number moves on, so a lease row that survives a crash
        here can never match a later delivery."""
        if self._swept:
            return
        self._check()
        lt = self.s.spark_lease
        with self.db.engine().connect() as conn:
            stale = self._leases(conn, lt.c.seq > start + 1)
        released = 0
        for i in range(0, len(stale), 5000):
            released += len(self._io.run(self._broker.engine.settle([
                Settlement(x, d, Outcome.RELEASE, attempted=False)
                for x, d, _ in stale[i : i + 5000]])))
            _fault("sweep:released")
        if stale:
            with self.db.engine().begin() as conn:
                conn.execute(delete(lt).where(lt.c.consumer == self.o.consumer,
                                              lt.c.seq > start + 1))
            _fault("sweep:deleted")
            log.info("sqlmq stream %s: released %d messages a previous run had leased ahead "
                     "of Spark's offset log", self.o.consumer, released)
        self._swept = True

    def lease_next(self, start: int, limit: int | None) -> tuple[int, int]:
        """The end offset of the next batch and how many messages were newly acquired."""
        self._check()
        nxt = start + 1
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            try:
                got = ahead.result()
            except Exception as exc:  # whatever it leased is an orphan, handled below
                log.warning("sqlmq stream %s: leasing ahead failed: %s", self.o.consumer, exc)
                got = 0
            if self._ahead_seq == nxt and got and limit != 0:
                return nxt, got
        lt = self.s.spark_lease
        with self.db.engine().connect() as conn:
            orphan = self._leases(conn, lt.c.seq == nxt)
        self._fresh.pop(nxt, None)  # an orphan is read back from the table
        if orphan:
            # Leased before a crash but never logged by Spark: keep what is still ours.
            kept = self._io.run(self._broker.engine.extend(
                [(x, d) for x, d, _ in orphan], self.o.lease))
            _fault("reuse:extended")
            if kept:
                if len(kept) < len(orphan):
                    with self.db.engine().begin() as conn:
                        conn.execute(delete(lt).where(
                            lt.c.consumer == self.o.consumer, lt.c.seq == nxt,
                            lt.c.id.not_in(list(kept))))
                return nxt, 0
            with self.db.engine().begin() as conn:
                conn.execute(delete(lt).where(lt.c.consumer == self.o.consumer, lt.c.seq == nxt))
        if limit == 0:
            return start, 0
        got_n = self._lease_fresh(nxt, limit)
        return (nxt, got_n) if got_n else (start, 0)

    def _lease_fresh(self, nxt: int, limit: int | None) -> int:
        """Acquire up to ``limit`` messages and record them as sequence ``nxt``, in the
        transaction that checks ownership. On every database the acquire and its lease rows
        commit together: a crash at any instant leaves the messages either untouched or
        leased *and* recorded (a restart reuses or releases them), never acquired and
        recorded nowhere, which would hold them PROCESSING until their lease expired."""
        take = self._take_function()
        cap = self._take_cap()
        leased: list[tuple[int, int, int]] = []
        with self.db.engine().begin() as conn:
            self._own(conn, nxt)
            _fault("lease:owned")
            while limit is None or len(leased) < limit:
                want = min(cap, _ACQUIRE_CHUNK if limit is None else limit - len(leased))
                got = take(conn, nxt, want)
                leased += got
                if len(got) < want:
                    break
            _fault("lease:recorded")
        _fault("lease:committed")
        if leased:
            leased.sort()
            self._fresh[nxt] = leased
        return len(leased)

    def _own(self, conn: Any, nxt: int) -> None:
        """Record ``nxt`` as leased, if this driver still owns the consumer name (the row
        lock also keeps a takeover out until the lease is recorded)."""
        c = self.s.spark_consumer
        highest = (func.max(c.c.leased_seq, nxt) if conn.dialect.name == "sqlite"
                   else func.greatest(c.c.leased_seq, nxt))
        owned = conn.execute(
            update(c).where(c.c.consumer == self.o.consumer, c.c.owner == self.token)
            .values(leased_seq=highest)
        ).rowcount
        if not owned:
            raise ConsumerBusy(f"consumer {self.o.consumer!r} was taken over by another "
                               "query while leasing")

    def _take_function(self) -> Any:
        return {"postgresql": self._take_pg, "mysql": self._take_mysql,
                "mariadb": self._take_mysql,
                "sqlite": self._take_sqlite}[self.db.engine().dialect.name]

    def _take_cap(self) -> int:
        """Most messages one acquire takes: a whole batch on PostgreSQL (one statement),
        what fits the id list on MySQL/MariaDB, ``_ACQUIRE_CHUNK`` on SQLite."""
        if self._cap is None:
            engine = self.db.engine()
            self._cap = 2**62 if engine.dialect.name == "postgresql" else _ACQUIRE_CHUNK
            if engine.dialect.name in ("mysql", "mariadb"):
                from ..engines.mysql import take_limit

                concat = None
                if getattr(engine.dialect, "is_mariadb", False):
                    with engine.connect() as conn:
                        concat = int(conn.exec_driver_sql(
                            "SELECT @@group_concat_max_len").scalar_one())
                self._cap = min(_ACQUIRE_CHUNK, take_limit(concat))
        return self._cap

    def _take_pg(self, conn: Any, nxt: int, want: int) -> list[tuple[int, int, int]]:
        """PostgreSQL: the engine's own acquire statement feeding the lease rows, in one
        statement: the messages never travel to this process."""
        from ..engines.postgres import acquire_text

        stmt = text(_LEASE_PG.format(
            acquire=acquire_text("queue = :queue").format(**self.s.names),
            lease=self.s.spark_lease.name))
        got = conn.execute(stmt, {"queue": self.o.queue, "limit": want,
                                  "lease": float(self.o.lease),
                                  "consumer": self.o.consumer, "seq": nxt}).all()
        _fault("lease:taken")
        return [tuple(r) for r in got]  # type: ignore[misc]

    def _take_mysql(self, conn: Any, nxt: int, want: int) -> list[tuple[int, int, int]]:
        """MySQL/MariaDB: the engine's lock and take statements, then the lease rows copied
        from the taken ids on the server, all in the caller's transaction."""
        from ..engines.mysql import lease_statements

        lock, take, taken = lease_statements(self.s.names)
        lt = self.s.spark_lease.name
        conn.exec_driver_sql(lock, (self.o.queue, want))
        _fault("lease:locked")
        conn.exec_driver_sql(take, (round(self.o.lease * 1_000_000),))
        _fault("lease:taken")
        conn.exec_driver_sql(
            f"INSERT INTO {lt} (consumer, seq, id, deliveries, attempts) "
            f"SELECT %s, %s, m.id, m.deliveries_count, m.attempts_count FROM {taken}",
            (self.o.consumer, nxt))
        _fault("lease:inserted")
        rows = conn.exec_driver_sql(
            f"SELECT m.id, m.deliveries_count, m.attempts_count FROM {taken}").all()
        return [tuple(r) for r in rows]  # type: ignore[misc]

    def _take_sqlite(self, conn: Any, nxt: int, want: int) -> list[tuple[int, int, int]]:
        """SQLite: the engine's ready and take statements, then the lease rows, in the
        caller's write transaction (BEGIN IMMEDIATE)."""
        from ..engines.sqlite import lease_statements

        ready_sql, take_sql = lease_statements(self.s.names)
        ready = conn.exec_driver_sql(ready_sql, {"queue": self.o.queue, "limit": want}).all()
        _fault("lease:locked")
        if not ready:
            return []
        taken = conn.exec_driver_sql(take_sql, {"ids": json.dumps([r[0] for r in ready]),
                                                "lease": float(self.o.lease)}).all()
        _fault("lease:taken")
        leased = [(r[0], r[5], r[4]) for r in taken]  # id, deliveries, attempts
        rows = [{"consumer": self.o.consumer, "seq": nxt, "id": x, "deliveries": d,
                 "attempts": a} for x, d, a in leased]
        for i in range(0, len(rows), 1000):
            conn.execute(insert(self.s.spark_lease), rows[i : i + 1000])
        _fault("lease:inserted")
        return leased

    def extend(self) -> None:
        lt = self.s.spark_lease
        with self.db.engine().connect() as conn:
            held = self._leases(conn, lt.c.seq > 0)
        for i in range(0, len(held), 5000):
            self._io.run(self._broker.engine.extend(
                [(x, d) for x, d, _ in held[i : i + 5000]], self.o.lease))


_LEASE_PG = """
WITH acquired AS ({acquire}),
leased AS (
    INSERT INTO {lease} (consumer, seq, id, deliveries, attempts)
    SELECT :consumer, :seq, id, deliveries_count, attempts_count FROM acquired
    RETURNING id, deliveries, attempts
)
SELECT id, deliveries, attempts FROM leased
"""


# The engine's settle of Outcome.COMPLETE (fenced on id, delivery and PROCESSING; one
# attempt; the history unchanged), fed by the lease rows it deletes.
_ACK_PG = """
WITH l AS (
    DELETE FROM {lease} WHERE consumer = :consumer AND seq <= :upto
    RETURNING id, deliveries
),
done AS (
    DELETE FROM {m} AS m USING l
    WHERE m.id = l.id AND m.deliveries_count = l.deliveries AND m.state = 'PROCESSING'
    RETURNING m.id, m.queue, m.headers, m.payload, m.attempts_count, m.deliveries_count,
        m.created_at, m.first_attempt_at, m.history
),
archived AS (
    INSERT INTO {a} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                     created_at, first_attempt_at, last_attempt_at, archived_at, error, history)
    SELECT id, queue, headers, payload, 'COMPLETED', attempts_count + 1, deliveries_count,
           created_at, first_attempt_at, now(), now(), NULL, history
    FROM done
    RETURNING 1
)
SELECT (SELECT count(*) FROM l), (SELECT count(*) FROM archived)
"""


_RELEASE_TIMEOUT = 15.0
_open: set[Consumer] = set()  # this process's consumers, released on SIGTERM
_handler_installed = False


def _release_on_sigterm(consumer: Consumer) -> None:
    """Spark ends the driver-side Python process of a stopped query with SIGTERM (twice,
    a few milliseconds apart); release the consumer name then, so that a restart does not
    wait for a stale heartbeat.

    The signal may arrive while the main thread is inside a transaction holding the
    consumer's row lock. Releasing from the handler itself would wait for that lock
    forever (the main thread cannot resume until the handler returns), leaving a process
    that holds locks on the queue's tables. So the release runs on its own thread while the
    main thread finishes what it was doing, and the process exits when the release is
    done, or after ``_RELEASE_TIMEOUT`` whatever happens. Further SIGTERMs are ignored
    meanwhile: with the default action the second one would kill the process before the
    release."""
    global _handler_installed
    _open.add(consumer)
    if _handler_installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return  # the application handles SIGTERM itself
    releasing: list[bool] = []

    def release_and_exit(code: int) -> None:
        try:
            for c in list(_open):
                with contextlib.suppress(Exception):
                    c.close()
        finally:
            os._exit(code)

    def handler(signum: int, frame: Any) -> None:
        if releasing:
            return
        releasing.append(True)
        deadline = threading.Timer(_RELEASE_TIMEOUT, os._exit, args=(128 + signum,))
        deadline.daemon = True
        deadline.start()
        threading.Thread(target=release_and_exit, args=(128 + signum,),
                         name="sqlmq-spark-release").start()

    signal.signal(signal.SIGTERM, handler)
    _handler_installed = True
