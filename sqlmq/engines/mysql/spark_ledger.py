"""MySQL's and MariaDB's Spark ledger: the engine's level, lock and take statements, then the
lease rows copied from the taken ids on the server; acknowledgements by the engine's settle."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from ...lifecycle import Outcome
from ...records import Settlement
from ..spark.ledger import ACQUIRE_CHUNK, Lease, SparkLedger
from ..sql.statements import render
from . import statements as sql

if TYPE_CHECKING:
    from .engine import AcquireStatements


class MysqlLedger(SparkLedger):
    def _take_cap(self) -> int:
        """What fits the engine's id list (bounded by MariaDB's ``group_concat_max_len``)."""
        from .engine import take_limit

        concat = None
        if getattr(self.sql_engine.dialect, "is_mariadb", False):
            with self.sql_engine.connect() as conn:
                concat = int(conn.exec_driver_sql(sql.GROUP_CONCAT_MAX_LEN).scalar_one())
        return min(ACQUIRE_CHUNK, take_limit(concat))

    @cached_property
    def _statements(self) -> dict[str, str]:
        n = self.names
        return {
            "record": render(sql.SPARK_RECORD_LEASE, n),
            "taken": render(sql.SPARK_READ_TAKEN, n),
            "set": render(sql.SETTLE_INPUT, n),
            "lock_settled": render(sql.SETTLE_LOCK, n),
            "archive": render(sql.SETTLE_ARCHIVE, n),
            "delete": render(sql.SETTLE_DELETE, n),
            "clear": render(sql.SETTLE_CLEAR, n),
        }

    @cached_property
    def _lock(self) -> AcquireStatements:
        from .engine import acquire_statements

        return acquire_statements(self.names, 1)

    def take(self, conn: Connection, queue: str, consumer: str, seq: int, want: int,
             lease: float) -> list[Lease]:
        """The engine's level, lock and take statements, then the lease rows copied from the
        taken ids on the server, all in the caller's transaction: a round per priority
        level, as the engine's acquire, while levels below have rows to give."""
        from .engine import TOP_LEVEL

        q, a = self._statements, self._lock
        out: list[Lease] = []
        below = TOP_LEVEL
        while True:
            conn.exec_driver_sql(a.level, (queue, below))
            conn.exec_driver_sql(a.lock, (queue, want - len(out)))
            self.checkpoint("lease:locked")
            conn.exec_driver_sql(a.take, (round(lease * 1_000_000),))
            self.checkpoint("lease:taken")
            conn.exec_driver_sql(q["record"], (consumer, seq))
            self.checkpoint("lease:inserted")
            out += [tuple(r) for r in conn.exec_driver_sql(q["taken"]).all()]  # type: ignore[misc]
            conn.exec_driver_sql(a.next_level, (queue,))
            level, below_it = conn.exec_driver_sql(sql.ACQUIRE_LEVELS_READ).one()
            if len(out) >= want or below_it is None:
                return out
            below = level

    def _complete(self, conn: Connection, held: list[Lease]) -> int:
        """The engine's fenced COMPLETE settle, its rows locked in id order like the
        engine's."""
        from ..sql.engine import SqlEngine

        q = self._statements
        conn.exec_driver_sql(q["set"], (SqlEngine.settlement_json(
            [Settlement(x, d, Outcome.COMPLETE) for x, d, _ in sorted(held)]),))
        landed = len(conn.exec_driver_sql(q["lock_settled"]).all())
        conn.exec_driver_sql(q["archive"])
        conn.exec_driver_sql(q["delete"])
        conn.exec_driver_sql(q["clear"])
        return landed
