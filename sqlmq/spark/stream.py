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

The driver's side lives in :mod:`.consumer` (ownership, leasing, acknowledgements); every
statement on the database goes through the database's Spark ledger
(:mod:`sqlmq.engines.spark`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..engines.spark import LEASED_COLUMNS
from ..errors import SqlmqError
from ..lifecycle import State
from .columns import MESSAGE_COLUMNS, record_batch
from .consumer import Consumer
from .options import ROWS_PER_PARTITION, Database, StreamOptions, stream_options
from .ownership import ConsumerBusy


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
        if self._budget is None:
            end, _ = c.lease_next(start["seq"], n)
        else:
            n = self._budget if n is None else min(n, self._budget)
            end, fresh = c.lease_next(start["seq"], n)
            self._budget = max(0, self._budget - fresh)
            n = min(n, self._budget)  # what the lease ahead may take
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
    n = len(part.ids)
    rows = db.ledger().read_leased(part.ids)
    if len(rows) < n:
        found = {r[0] for r in rows}
        lost = [x for x in part.ids if x not in found]
        s = db.schema
        raise SqlmqError(f"leased messages {lost[:10]} are gone from {s.message.name} and "
                         f"{s.archive.name}")
    given = {
        "state": [State.PROCESSING.value] * n, "attempts": part.attempts,
        "deliveries": part.deliveries, "next_attempt_at": [None] * n,
        "lease_expires_at": [None] * n,
    }
    yield record_batch(LEASED_COLUMNS, rows, MESSAGE_COLUMNS, given)


__all__ = ["ROWS_PER_PARTITION", "Consumer", "ConsumerBusy", "LeasedIds", "QueueStreamReader",
           "StreamOptions", "read_leased", "stream_options"]
