"""SQLite's Spark ledger: the engine's ready and take statements, then the lease rows, in
the caller's write transaction (BEGIN IMMEDIATE); acknowledgements by the engine's settle."""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from sqlalchemy import func
from sqlalchemy.engine import Connection

from ...lifecycle import Outcome
from ...records import Settlement
from ..spark.ledger import Lease, SparkLedger
from ..sql.statements import render
from . import statements as sql


class SqliteLedger(SparkLedger):
    def _highest(self, column: Any, value: int) -> Any:
        return func.max(column, value)  # SQLite's two-argument max is GREATEST

    @cached_property
    def _statements(self) -> dict[str, str]:
        n = self.names
        return {
            "ready": render(sql.ACQUIRE_READY, n),
            "take": render(sql.ACQUIRE_TAKE, n),
            "record": render(sql.SPARK_RECORD_LEASE, n),
            "archive": render(sql.SETTLE_ARCHIVE, n),
            "delete": render(sql.SETTLE_DELETE, n),
        }

    def take(self, conn: Connection, queue: str, consumer: str, seq: int, want: int,
             lease: float) -> list[Lease]:
        """The engine's ready and take statements, then the lease rows (one executemany)."""
        q = self._statements
        ready = conn.exec_driver_sql(q["ready"], {"queue": queue, "limit": want}).all()
        self.checkpoint("lease:locked")
        if not ready:
            return []
        taken = conn.exec_driver_sql(q["take"], {"ids": json.dumps([r[0] for r in ready]),
                                                 "lease": float(lease)}).all()
        self.checkpoint("lease:taken")
        leased = [(r[0], r[5], r[4]) for r in taken]  # id, deliveries, attempts
        if leased:
            conn.exec_driver_sql(q["record"], [
                {"consumer": consumer, "seq": seq, "id": x, "deliveries": d, "attempts": a}
                for x, d, a in leased])
        self.checkpoint("lease:inserted")
        return leased

    def _complete(self, conn: Connection, held: list[Lease]) -> int:
        """The engine's fenced COMPLETE settle, in ``conn``'s transaction."""
        from ..sql.engine import SqlEngine

        q = self._statements
        batch = {"input": SqlEngine.settlement_json(
            [Settlement(x, d, Outcome.COMPLETE) for x, d, _ in held])}
        conn.exec_driver_sql(q["archive"], batch)
        return len(conn.exec_driver_sql(q["delete"], batch).all())
