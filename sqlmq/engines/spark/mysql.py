"""MySQL's and MariaDB's Spark ledger: the engine's probe, lock and take statements, then the
lease rows copied from the taken ids on the server; acknowledgements by the engine's settle."""

from __future__ import annotations

from functools import cached_property

from sqlalchemy.engine import Connection

from ...lifecycle import Outcome
from ...records import Settlement
from ..sql import mysql as sql
from ..sql import render
from .ledger import ACQUIRE_CHUNK, Lease, SparkLedger


class MysqlLedger(SparkLedger):
    def _take_cap(self) -> int:
        """What fits the engine's id list (bounded by MariaDB's ``group_concat_max_len``)."""
        from ..mysql import take_limit

        concat = None
        if getattr(self.sql_engine.dialect, "is_mariadb", False):
            with self.sql_engine.connect() as conn:
                concat = int(conn.exec_driver_sql(sql.GROUP_CONCAT_MAX_LEN).scalar_one())
        return min(ACQUIRE_CHUNK, take_limit(concat))

    @cached_property
    def _statements(self) -> dict[str, str]:
        n = self.names
        return {
            "probe": render(sql.ACQUIRE_PROBE, {**n, "queues": "%s"}),
            "lock": render(sql.ACQUIRE_LOCK, {**n, "queues": "%s"}),
            "take": render(sql.ACQUIRE_TAKE, n),
            "record": render(sql.SPARK_RECORD_LEASE, n),
            "taken": render(sql.SPARK_READ_TAKEN, n),
            "set": render(sql.SETTLE_INPUT, n),
            "lock_settled": render(sql.SETTLE_LOCK, n),
            "archive": render(sql.SETTLE_ARCHIVE, n),
            "delete": render(sql.SETTLE_DELETE, n),
            "clear": render(sql.SETTLE_CLEAR, n),
        }

    def take(self, conn: Connection, queue: str, consumer: str, seq: int, want: int,
             lease: float) -> list[Lease]:
        """The engine's probe, lock and take statements, then the lease rows copied from the taken
        ids on the server, all in the caller's transaction."""
        q = self._statements
        conn.exec_driver_sql(q["probe"], (queue,))
        conn.exec_driver_sql(q["lock"], (queue, want))
        self.checkpoint("lease:locked")
        conn.exec_driver_sql(q["take"], (round(lease * 1_000_000),))
        self.checkpoint("lease:taken")
        conn.exec_driver_sql(q["record"], (consumer, seq))
        self.checkpoint("lease:inserted")
        rows = conn.exec_driver_sql(q["taken"]).all()
        return [tuple(r) for r in rows]  # type: ignore[misc]

    def _complete(self, conn: Connection, held: list[Lease]) -> int:
        """The engine's fenced COMPLETE settle, its rows locked in id order like the
        engine's."""
        from ..base import SqlEngine

        q = self._statements
        conn.exec_driver_sql(q["set"], (SqlEngine.settlement_json(
            [Settlement(x, d, Outcome.COMPLETE) for x, d, _ in sorted(held)]),))
        landed = len(conn.exec_driver_sql(q["lock_settled"]).all())
        conn.exec_driver_sql(q["archive"])
        conn.exec_driver_sql(q["delete"])
        conn.exec_driver_sql(q["clear"])
        return landed
