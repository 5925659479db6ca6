"""SQLite: every transaction is ``BEGIN IMMEDIATE`` (set up in :mod:`sqlmq.connect`), so a
writer holds the database's single write lock from its first statement. That serialises
acquire and settle across processes sharing one file, which is what SKIP LOCKED gives the
server databases; WAL keeps readers going meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..records import Delivery, Settlement
from ..sqltime import SQLITE_NOW, sqlite_now_plus
from .base import DELIVERY_COLUMNS, ArchiveAndStatsMixin, SqlEngine

NOW = SQLITE_NOW

_READY = f"""
SELECT id, next_attempt_at AS scheduled_at FROM {{m}}
WHERE queue IN (SELECT value FROM json_each(:queues)) AND next_attempt_at <= {NOW}
ORDER BY next_attempt_at, id
LIMIT :limit
"""

_TAKE = f"""
UPDATE {{m}} SET
    state = 'PROCESSING',
    deliveries_count = deliveries_count + 1,
    acquired_at = {NOW},
    first_attempt_at = COALESCE(first_attempt_at, {NOW}),
    next_attempt_at = NULL,
    lease_expires_at = {sqlite_now_plus(':lease')}
WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING id, queue, headers, payload, attempts_count, deliveries_count, created_at,
    first_attempt_at, acquired_at, lease_expires_at, NULL AS scheduled_at, history
"""

# The input batch, one JSON array per settlement (see SqlEngine.settlement_json).
_INPUT = """
WITH i AS (
    SELECT value->>0 AS id, value->>1 AS deliveries, value->>2 AS outcome, value->>3 AS error,
           value->>4 AS delay, value->>5 AS refund, value->>6 AS attempt, value->>7 AS history
    FROM json_each(:input)
)
"""

_MATCHED = _INPUT + """
SELECT m.id, i.outcome FROM i JOIN {m} AS m ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING'
"""

_ARCHIVE = _INPUT + f"""
INSERT INTO {{a}} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                   created_at, first_attempt_at, last_attempt_at, archived_at, error, history)
SELECT m.id, m.queue, m.headers, m.payload, i.outcome, m.attempts_count + i.attempt,
       m.deliveries_count, m.created_at, m.first_attempt_at,
       CASE WHEN i.attempt = 1 THEN {NOW} ELSE m.last_attempt_at END, {NOW}, i.error,
       COALESCE(i.history, m.history)
FROM i JOIN {{m}} AS m ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED')
"""

_DELETE = "DELETE FROM {m} WHERE id IN (SELECT value FROM json_each(:ids))"

_UPDATE = _INPUT + f"""
UPDATE {{m}} AS m SET
    state = CASE WHEN i.outcome = 'RETRY' THEN 'RETRYABLE' ELSE 'PENDING' END,
    attempts_count = m.attempts_count + i.attempt,
    deliveries_count = m.deliveries_count - i.refund,
    last_attempt_at = CASE WHEN i.attempt = 1 THEN {NOW} ELSE m.last_attempt_at END,
    next_attempt_at = {sqlite_now_plus('i.delay')},
    lease_expires_at = NULL,
    last_error = COALESCE(i.error, m.last_error),
    history = COALESCE(i.history, m.history)
FROM i
WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
  AND i.outcome IN ('RETRY', 'RELEASE')
"""

# RETURNING may name only the updated table's columns, and not through its alias.
_EXTEND = f"""
UPDATE {{m}} AS m SET lease_expires_at = {sqlite_now_plus(':seconds')}
FROM (SELECT value->>0 AS id, value->>1 AS deliveries FROM json_each(:leases)) AS i
WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
RETURNING id
"""

_APPENDED = """json_insert(COALESCE(history, '[]'), '$[#]', json_object(
    'delivery', deliveries_count, 'ended', 'lease_expired',
    'at', strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')))"""

_RECOVER = f"""
UPDATE {{m}} SET
    state = 'PENDING',
    next_attempt_at = {sqlite_now_plus('(abs(random()) % 1000000) / 1000000.0 * :spread')},
    lease_expires_at = NULL,
    last_error = 'lease expired',
    history = CASE WHEN json_array_length({_APPENDED}) > 10
                   THEN json_remove({_APPENDED}, '$[0]') ELSE {_APPENDED} END
WHERE id IN (
    SELECT id FROM {{m}}
    WHERE lease_expires_at < {NOW} AND state = 'PROCESSING'
    ORDER BY lease_expires_at
    LIMIT :limit
)
RETURNING id
"""


class SqliteEngine(ArchiveAndStatsMixin, SqlEngine):
    dialect = "sqlite"

    async def acquire(self, queues: Sequence[str], limit: int, lease: float) -> list[Delivery]:
        async with self.db.begin() as conn:
            # One queue reads the ready index in order; a list of queues (json_each) makes
            # SQLite sort every ready row of the backlog on each acquire.
            ready_sql = _READY.replace(
                "queue IN (SELECT value FROM json_each(:queues))", "queue = :queue"
            ) if len(queues) == 1 else _READY
            ready = (
                await conn.execute(
                    self.sql(ready_sql, "id", "scheduled_at"),
                    {"queues": json.dumps(list(queues)), "queue": queues[0], "limit": limit},
                )
            ).all()
            if not ready:
                return []
            scheduled = {r.id: r.scheduled_at for r in ready}
            rows = (
                await conn.execute(
                    self.sql(_TAKE, *DELIVERY_COLUMNS),
                    {"ids": json.dumps(list(scheduled)), "lease": lease},
                )
            ).all()
        out = []
        for row in rows:
            d = self.delivery(row)
            d.scheduled_at = scheduled[d.id]
            out.append(d)
        out.sort(key=lambda d: (d.scheduled_at, d.id))
        return out

    async def settle(self, settlements: Sequence[Settlement]) -> set[int]:
        if not settlements:
            return set()
        params = {"input": self.settlement_json(settlements)}
        async with self.db.begin() as conn:
            matched = (await conn.execute(self.sql(_MATCHED), params)).all()
            if not matched:
                return set()
            if any(o in ("COMPLETED", "FAILED") for _, o in matched):
                await conn.execute(self.sql(_ARCHIVE), params)
                archived = [i for i, o in matched if o in ("COMPLETED", "FAILED")]
                await conn.execute(self.sql(_DELETE), {"ids": json.dumps(archived)})
            if any(o in ("RETRY", "RELEASE") for _, o in matched):
                await conn.execute(self.sql(_UPDATE), params)
        return {i for i, _ in matched}

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        if not leases:
            return set()
        async with self.db.begin() as conn:
            result = await conn.execute(
                self.sql(_EXTEND),
                {"leases": json.dumps([list(x) for x in leases]), "seconds": seconds},
            )
            return {r[0] for r in result}

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        # BEGIN IMMEDIATE already makes recoverers take turns; no lock of our own needed.
        async with self.db.begin() as conn:
            result = await conn.execute(self.sql(_RECOVER), {"limit": limit, "spread": spread})
            return [r[0] for r in result]
