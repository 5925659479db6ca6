"""The Spark stream's and sink's bookkeeping on one database: its *Spark ledger*.

The Spark code (``sqlmq/spark``) never asks which database it is on: it calls a ledger's
methods, chosen once by :func:`sqlmq.engines.spark.ledger_for` from the dialect of a
synchronous SQLAlchemy engine (Spark runs plain threads and processes, no event loop). This
base class does in SQLAlchemy Core what is the same on every database; each database's
class overrides what that database does its own way (one statement where it can, COPY,
server-side id lists), with its statement text beside the engine's in ``sql/<database>.py``.

Acquiring and settling are the engines' own statements, run here inside the ledger's
transaction: a lease is acquired and recorded together, and an acknowledgement archives,
drops the lease rows and records the sequence together, so a crash at any instant leaves
each message either untouched or wholly accounted for.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import delete, func, insert, literal, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine as SyncEngine

from ...lifecycle import State
from ...schema import Schema
from ...sqltime import db_now_plus
from ..sql.statements import names_for

#: ``(id, deliveries, attempts)`` of one leased message: the delivery it was leased under.
Lease = tuple[int, int, int]

#: Most messages one take statement acquires where the database sets no bound of its own.
ACQUIRE_CHUNK = 10_000

#: The columns :meth:`SparkLedger.read_leased` returns, in order.
LEASED_COLUMNS = ("id", "queue", "headers", "payload", "created_at", "first_attempt_at",
                  "last_attempt_at", "error")


def _passed(point: str) -> None:
    """The default checkpoint: nothing (crash tests pass one that may kill the process)."""


class SparkLedger:
    """Leases, acknowledgements, reads and staged rows of the Spark source and sink.

    ``checkpoint(point)`` is called between statements at named points (``lease:taken``,
    ``ack:settled``, ...) so that crash tests can kill a driver there; it costs a call.
    """

    def __init__(self, sql_engine: SyncEngine, schema: Schema,
                 checkpoint: Callable[[str], None] | None = None) -> None:
        self.sql_engine = sql_engine
        self.schema = schema
        #: The fields of this prefix's statements (see ``engines.sql.render``).
        self.names = {**names_for(schema), "spark_lease": schema.spark_lease.name,
                      "spark_staging": schema.spark_staging.name}
        self.checkpoint = checkpoint or _passed
        self._cap: int | None = None

    # ---- leasing ---------------------------------------------------------------------------

    @property
    def take_cap(self) -> int:
        """Most messages one :meth:`take` acquires (worked out once)."""
        if self._cap is None:
            self._cap = self._take_cap()
        return self._cap

    def _take_cap(self) -> int:
        return ACQUIRE_CHUNK

    def own(self, conn: Connection, consumer: str, token: str, seq: int) -> bool:
        """Record ``seq`` as leased if ``token`` still owns ``consumer`` (the row lock also
        keeps a takeover out until the transaction ends); False if it does not."""
        c = self.schema.spark_consumer
        return bool(conn.execute(
            update(c).where(c.c.consumer == consumer, c.c.owner == token)
            .values(leased_seq=self._highest(c.c.leased_seq, seq))
        ).rowcount)

    def _highest(self, column: Any, value: int) -> Any:
        return func.greatest(column, value)

    def take(self, conn: Connection, queue: str, consumer: str, seq: int, want: int,
             lease: float) -> list[Lease]:
        """Acquire up to ``want`` (at most :attr:`take_cap`) ready messages of ``queue`` for
        ``lease`` seconds and record them as sequence ``seq`` of ``consumer``, in ``conn``'s
        transaction."""
        raise NotImplementedError

    def leases(self, conn: Connection, consumer: str, after: int | None = None,
               upto: int | None = None) -> list[Lease]:
        """The lease rows of sequences in ``(after, upto]``, by id."""
        lt = self.schema.spark_lease
        stmt = select(lt.c.id, lt.c.deliveries, lt.c.attempts).where(
            lt.c.consumer == consumer, *self._seqs(after, upto)).order_by(lt.c.id)
        return [tuple(r) for r in conn.execute(stmt)]  # type: ignore[misc]

    def drop_leases(self, conn: Connection, consumer: str, after: int | None = None,
                    upto: int | None = None, keep: Sequence[int] = ()) -> None:
        """Delete the lease rows of sequences in ``(after, upto]``, but those of ``keep``."""
        lt = self.schema.spark_lease
        where = [lt.c.consumer == consumer, *self._seqs(after, upto)]
        if keep:
            where.append(lt.c.id.not_in(list(keep)))
        conn.execute(delete(lt).where(*where))

    def _seqs(self, after: int | None, upto: int | None) -> list[Any]:
        seq = self.schema.spark_lease.c.seq
        return ([] if after is None else [seq > after]) + ([] if upto is None else [seq <= upto])

    # ---- acknowledging ---------------------------------------------------------------------

    def acknowledge(self, consumer: str, upto: int) -> tuple[int, int]:
        """Archive COMPLETED every message of sequences ``<= upto`` (fenced on the delivery
        it was leased under), drop their lease rows and record ``upto`` as acknowledged, in
        one transaction. Returns how many were held and how many were archived (the others
        had lost their lease)."""
        landed = 0
        # The consumer row first, as when leasing.
        with self.sql_engine.begin() as conn:
            self._sequence(conn, consumer, upto)
            self.checkpoint("ack:sequenced")
            held = self.leases(conn, consumer, upto=upto)
            self.checkpoint("ack:read")
            for i in range(0, len(held), 5000):
                landed += self._complete(conn, held[i : i + 5000])
                self.checkpoint("ack:settled")
            self.drop_leases(conn, consumer, upto=upto)
            self.checkpoint("ack:deleted")
        return len(held), landed

    def _sequence(self, conn: Connection, consumer: str, upto: int) -> None:
        c = self.schema.spark_consumer
        conn.execute(update(c).where(c.c.consumer == consumer, c.c.acked_seq < upto)
                     .values(acked_seq=upto))

    def _complete(self, conn: Connection, held: list[Lease]) -> int:
        """The engine's fenced COMPLETE settle of ``held``, in ``conn``'s transaction; how
        many landed."""
        raise NotImplementedError

    # ---- reading ---------------------------------------------------------------------------

    def read_leased(self, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """The :data:`LEASED_COLUMNS` of messages ``ids``, from the message table or the
        archive (wherever each is now), in the order of ``ids``; an id found in neither is
        left out."""
        s = self.schema
        by_id: dict[int, tuple[Any, ...]] = {}
        with self.sql_engine.connect() as conn:
            for i in range(0, len(ids), 1000):
                chunk = ids[i : i + 1000]
                for table, error in ((s.message, s.message.c.last_error),
                                     (s.archive, s.archive.c.error)):
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
        return [by_id[x] for x in ids if x in by_id]

    def channel_waiting(self, queue: str) -> int:
        """Messages of ``queue`` published with a channel and not started yet. :meth:`take`
        reads the ready index only, where they are not: a channel's limits are counted by
        the subscribers' acquire, which the stream does not run."""
        m = self.schema.message
        with self.sql_engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(m).where(
                m.c.queue == queue, m.c.channel_due_at.is_not(None))).scalar_one()

    def timestamp(self, column: Any) -> Any:
        """A timestamp column as a batch read selects it (see ``spark.columns``)."""
        return column

    # ---- the sink --------------------------------------------------------------------------

    def insert_staged(self, token: str, attempt: int, rows: Sequence[tuple]) -> None:
        """Stage ``(queue, headers JSON, payload, delay, priority)`` rows of one task
        attempt, in a transaction of their own."""
        st = self.schema.spark_staging
        with self.sql_engine.begin() as conn:
            now = conn.execute(select(db_now_plus(literal(0.0)))).scalar_one()
            values = [
                {"token": token, "attempt": attempt, "queue": q, "headers": json.loads(h),
                 "payload": p, "delay": d, "staged_at": now, "priority": pr}
                for q, h, p, d, pr in rows
            ]
            for i in range(0, len(values), 1000):
                conn.execute(insert(st), values[i : i + 1000])

    def publish_staged(self, conn: Connection, tokens: Sequence[str],
                       attempts: Sequence[int]) -> int:
        """Move the rows staged by ``tokens`` in ``attempts`` to the message table, in the
        order they were staged, in ``conn``'s transaction, waking subscribers as any publish
        does; how many were published."""
        st, m = self.schema.spark_staging, self.schema.message
        published = 0
        for i in range(0, len(attempts), 500):
            src = (
                select(st.c.queue, st.c.headers, st.c.payload, literal(State.PENDING.value),
                       literal(0), literal(0), db_now_plus(literal(0.0)),
                       db_now_plus(st.c.delay), st.c.priority)
                .where(st.c.token.in_(list(tokens)), st.c.attempt.in_(attempts[i : i + 500]))
                .order_by(st.c.row_id)
            )
            # SQLAlchemy keeps an INSERT's row count only when asked.
            published += conn.execute(insert(m).from_select(
                ["queue", "headers", "payload", "state", "attempts_count",
                 "deliveries_count", "created_at", "next_attempt_at", "priority"], src),
                execution_options={"preserve_rowcount": True}).rowcount
        return published
