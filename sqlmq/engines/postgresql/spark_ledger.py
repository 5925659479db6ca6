"""PostgreSQL's Spark ledger: one statement per lease, acknowledgement and read, and the
sink's rows staged by binary COPY and published with the NOTIFY every publish sends."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from sqlalchemy import BigInteger, cast, func
from sqlalchemy.engine import Connection

from ..spark.ledger import Lease, SparkLedger
from ..sql.statements import render
from . import statements as sql
from .notify import channel_for

#: The engine's planner settings (``INDEX_PLANS_ON``) for the leasing transaction alone.
_INDEX_PLANS_LOCAL = ("SET LOCAL enable_seqscan = off", "SET LOCAL enable_bitmapscan = off")


class PostgresLedger(SparkLedger):
    def _take_cap(self) -> int:
        return 2**62  # a whole batch in one statement

    def take(self, conn: Connection, queue: str, consumer: str, seq: int, want: int,
             lease: float) -> list[Lease]:
        """The engine's own acquire statement feeding the lease rows, in one statement: the
        messages never travel to this process. Planned as the engine plans its acquire
        (``INDEX_PLANS_ON``, for this transaction only): left to itself, on the half-filled
        pages of the message table the planner bitmap-scanned the ready rows and sorted
        them."""
        for setting in _INDEX_PLANS_LOCAL:
            conn.exec_driver_sql(setting)
        got = _raw(conn, self._lease, (queue, want, float(lease), consumer, seq))
        self.checkpoint("lease:taken")
        return got  # type: ignore[return-value]

    @cached_property
    def _lease(self) -> str:
        return render(sql.SPARK_LEASE, self.names)

    def acknowledge(self, consumer: str, upto: int) -> tuple[int, int]:
        """The lease rows feed the engine's fenced COMPLETE settle in one statement, in the
        transaction that records ``upto``: nothing travels to this process."""
        with self.sql_engine.begin() as conn:
            ((held, landed),) = _raw(conn, render(sql.SPARK_ACKNOWLEDGE, self.names),
                                     (consumer, upto))
            self.checkpoint("ack:settled")
            self._sequence(conn, consumer, upto)
            self.checkpoint("ack:sequenced")
        return held, landed

    def read_leased(self, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """One statement for the whole partition, in the order given: the ids travel as one
        array literal (parsed by the server), timestamps as epoch microseconds."""
        with self.sql_engine.connect() as conn:
            return _raw(conn, render(sql.SPARK_READ_LEASED, self.names),
                        ("{" + ",".join(map(str, ids)) + "}",))

    def timestamp(self, column: Any) -> Any:
        """Integer microseconds since the epoch: Arrow takes those as they are, where a
        datetime costs a Python object and a conversion per value."""
        return cast(func.extract("epoch", column) * 1_000_000, BigInteger)

    def insert_staged(self, token: str, attempt: int, rows: Sequence[tuple]) -> None:
        """COPY is several times faster than INSERT for the bulk of a write job, and its
        binary format spares the server most of the parsing (hex payloads, timestamps)."""
        raw = self.sql_engine.raw_connection()
        try:
            cur = raw.driver_connection.cursor()  # type: ignore[union-attr]
            cur.execute(sql.SPARK_STAGE_CLOCK)
            now = cur.fetchone()[0]
            with cur.copy(render(sql.SPARK_STAGE_COPY, self.names)) as copy:
                copy.write(_COPY_SIGNATURE)
                for i in range(0, len(rows), 10_000):
                    copy.write(_copy_binary(token, attempt, now, rows[i : i + 10_000]))
                copy.write(_COPY_TRAILER)
            raw.commit()
        finally:
            raw.close()

    def publish_staged(self, conn: Connection, tokens: Sequence[str],
                       attempts: Sequence[int]) -> int:
        """One statement, with the NOTIFY of each queue published to (sent at commit)."""
        conn.exec_driver_sql(sql.SPARK_PUBLISH_MEMORY)
        ((moved, _),) = _raw(conn, render(sql.SPARK_PUBLISH_STAGED, self.names),
                             (list(tokens), list(attempts), channel_for(self.schema)))
        return int(moved)


def _raw(conn: Connection, statement: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Run a ``$n`` statement on ``conn``'s psycopg connection, in its transaction, and
    return its rows. psycopg's raw cursor takes PostgreSQL's own placeholders, as the
    engine's statements are written (SQLAlchemy's psycopg dialect expects ``%s``)."""
    import psycopg

    with psycopg.RawCursor(conn.connection.driver_connection) as cur:  # type: ignore[arg-type]
        cur.execute(statement, params)
        return cur.fetchall() if cur.description is not None else []


_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # no flags, no header extension
_COPY_TRAILER = b"\xff\xff"
_I4 = struct.Struct(">i").pack


def _copy_binary(token: str, attempt: int, now: int, rows: Sequence[tuple]) -> bytes:
    """Rows in COPY's binary format (PostgreSQL's own wire representation of each column),
    built in one pass: psycopg's ``write_row`` costs several times more per row. Queue
    names, header texts, delays and priorities repeat, so each is encoded once. ``now`` is the
    server's time in microseconds since 2000-01-01 (``timestamptz``'s binary form)."""
    tok = token.encode()
    # 8 fields; token (text), attempt (int8), then per row: queue (text), headers (jsonb:
    # version 1 and the text), payload (bytea), delay (float8), staged_at (timestamptz),
    # priority (int4).
    lead = struct.pack(">hi", 8, len(tok)) + tok + struct.pack(">iq", 8, attempt)
    texts: dict[str, bytes] = {}
    headers: dict[str, bytes] = {}
    tails: dict[tuple[float, int], bytes] = {}

    def text_field(value: str) -> bytes:
        out = texts.get(value)
        if out is None:
            b = value.encode()
            out = texts[value] = _I4(len(b)) + b
        return out

    def header(value: str) -> bytes:
        out = headers.get(value)
        if out is None:
            b = value.encode()
            out = headers[value] = _I4(len(b) + 1) + b"\x01" + b
        return out

    def tail(delay: float, priority: int) -> bytes:
        out = tails.get((delay, priority))
        if out is None:
            out = tails[delay, priority] = struct.pack(">idiqii", 8, delay, 8, now, 4, priority)
        return out

    return b"".join([lead + text_field(q) + header(h) + _I4(len(p)) + p + tail(d, pr)
                     for q, h, p, d, pr in rows])
