"""MySQL 8 and MariaDB 10.6+: no ``UPDATE … RETURNING``, so acquire is a short transaction
(``SELECT … FOR UPDATE SKIP LOCKED`` of whole rows, then one ``UPDATE``). A settle batch
travels as one JSON parameter, opened with ``JSON_TABLE``; its rows are locked first so that
copying to the archive and deleting see the same rows. Sessions run READ COMMITTED (set in
:mod:`sqlmq.connect`) to keep gap locks out of the way of other consumers.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import bindparam, text

from ..records import Delivery, Settlement
from ..schema import UTCDateTime
from .base import ArchiveAndStatsMixin, SqlEngine

NOW = "UTC_TIMESTAMP(6)"

_READY = f"""
SELECT id, queue, headers, payload, attempts_count, deliveries_count, created_at,
       first_attempt_at, next_attempt_at AS scheduled_at, history, {NOW} AS db_now
FROM {{m}}
WHERE queue IN :queues AND next_attempt_at <= {NOW}
ORDER BY next_attempt_at, id
LIMIT :limit
FOR UPDATE SKIP LOCKED
"""

_TAKE = """
UPDATE {m} SET
    state = 'PROCESSING',
    deliveries_count = deliveries_count + 1,
    acquired_at = :now,
    first_attempt_at = COALESCE(first_attempt_at, :now),
    next_attempt_at = NULL,
    lease_expires_at = :lease_expires_at
WHERE id IN :ids
"""

_INPUT = """JSON_TABLE(:input, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]', outcome VARCHAR(10) PATH '$[2]',
    error LONGTEXT PATH '$[3]', delay DOUBLE PATH '$[4]', refund INT PATH '$[5]',
    attempt INT PATH '$[6]', history LONGTEXT PATH '$[7]'
)) AS i"""

_JOIN = "{m} AS m JOIN " + _INPUT + " ON m.id = i.id AND m.deliveries_count = i.deliveries"

_LOCK = f"SELECT m.id, i.outcome FROM {_JOIN} WHERE m.state = 'PROCESSING' FOR UPDATE"

_ARCHIVE = f"""
INSERT INTO {{a}} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                   created_at, first_attempt_at, last_attempt_at, archived_at, error, history)
SELECT m.id, m.queue, m.headers, m.payload, i.outcome, m.attempts_count + i.attempt,
       m.deliveries_count, m.created_at, m.first_attempt_at,
       CASE WHEN i.attempt = 1 THEN {NOW} ELSE m.last_attempt_at END, {NOW}, i.error,
       COALESCE(i.history, m.history)
FROM {_JOIN}
WHERE m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED')
"""

_DELETE = "DELETE FROM {m} WHERE id IN :ids"

_UPDATE = f"""
UPDATE {_JOIN} SET
    m.state = CASE WHEN i.outcome = 'RETRY' THEN 'RETRYABLE' ELSE 'PENDING' END,
    m.attempts_count = m.attempts_count + i.attempt,
    m.deliveries_count = m.deliveries_count - i.refund,
    m.last_attempt_at = CASE WHEN i.attempt = 1 THEN {NOW} ELSE m.last_attempt_at END,
    m.next_attempt_at = {NOW} + INTERVAL CAST(i.delay * 1000000 AS SIGNED) MICROSECOND,
    m.lease_expires_at = NULL,
    m.last_error = COALESCE(i.error, m.last_error),
    m.history = COALESCE(i.history, m.history)
WHERE m.state = 'PROCESSING' AND i.outcome IN ('RETRY', 'RELEASE')
"""

_EXTEND_LOCK = """
SELECT m.id FROM {m} AS m JOIN JSON_TABLE(:leases, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]')) AS i
  ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING' FOR UPDATE
"""

_EXTEND = f"""
UPDATE {{m}} SET lease_expires_at = {NOW} + INTERVAL :us MICROSECOND WHERE id IN :ids
"""

_EXPIRED = f"""
SELECT id FROM {{m}} WHERE lease_expires_at < {NOW} AND state = 'PROCESSING'
ORDER BY lease_expires_at LIMIT :limit FOR UPDATE SKIP LOCKED
"""

_APPENDED = f"""JSON_ARRAY_APPEND(COALESCE(history, '[]'), '$', JSON_OBJECT(
    'delivery', deliveries_count, 'ended', 'lease_expired',
    'at', DATE_FORMAT({NOW}, '%Y-%m-%dT%H:%i:%s.%f+00:00')))"""

_RECOVER = f"""
UPDATE {{m}} SET
    state = 'PENDING',
    next_attempt_at = {NOW} + INTERVAL CAST(RAND() * :spread * 1000000 AS SIGNED) MICROSECOND,
    lease_expires_at = NULL,
    last_error = 'lease expired',
    history = CASE WHEN JSON_LENGTH({_APPENDED}) > 10
                   THEN JSON_REMOVE({_APPENDED}, '$[0]') ELSE {_APPENDED} END
WHERE id IN :ids
"""


class MysqlEngine(ArchiveAndStatsMixin, SqlEngine):
    dialect = "mysql"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        ids = bindparam("ids", expanding=True)
        self._ready = self.sql(
            _READY, "id", "queue", "headers", "payload", "attempts_count", "deliveries_count",
            "created_at", "first_attempt_at", "scheduled_at", "history", "db_now",
        ).bindparams(bindparam("queues", expanding=True))
        self._take = self.sql(_TAKE).bindparams(
            ids, bindparam("now", type_=UTCDateTime()),
            bindparam("lease_expires_at", type_=UTCDateTime()),
        )
        self._delete = self.sql(_DELETE).bindparams(ids)
        self._extend = self.sql(_EXTEND).bindparams(ids)
        self._recover = self.sql(_RECOVER).bindparams(ids)

    async def acquire(self, queues: Sequence[str], limit: int, lease: float) -> list[Delivery]:
        async with self.db.begin() as conn:
            rows = (
                await conn.execute(self._ready, {"queues": list(queues), "limit": limit})
            ).all()
            if not rows:
                return []
            now = rows[0].db_now
            lease_expires_at = now + timedelta(seconds=lease)
            await conn.execute(
                self._take,
                {"ids": [r.id for r in rows], "now": now, "lease_expires_at": lease_expires_at},
            )
        out = []
        for r in rows:
            out.append(
                Delivery(
                    id=r.id,
                    queue=r.queue,
                    headers=_loads(r.headers) or {},
                    payload=bytes(r.payload),
                    attempts=r.attempts_count,
                    deliveries=r.deliveries_count + 1,
                    created_at=r.created_at,
                    first_attempt_at=r.first_attempt_at or now,
                    acquired_at=now,
                    lease_expires_at=lease_expires_at,
                    scheduled_at=r.scheduled_at,
                    history=_loads(r.history) or [],
                )
            )
        return out

    async def settle(self, settlements: Sequence[Settlement]) -> set[int]:
        if not settlements:
            return set()
        params = {"input": self.settlement_json(settlements)}
        async with self.db.begin() as conn:
            matched = (await conn.execute(self.sql(_LOCK), params)).all()
            if not matched:
                return set()
            archived = [i for i, o in matched if o in ("COMPLETED", "FAILED")]
            if archived:
                await conn.execute(self.sql(_ARCHIVE), params)
                await conn.execute(self._delete, {"ids": archived})
            if len(archived) < len(matched):
                await conn.execute(self.sql(_UPDATE), params)
        return {i for i, _ in matched}

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        if not leases:
            return set()
        async with self.db.begin() as conn:
            held = (
                await conn.execute(
                    self.sql(_EXTEND_LOCK), {"leases": json.dumps([list(x) for x in leases])}
                )
            ).scalars().all()
            if held:
                await conn.execute(
                    self._extend, {"ids": list(held), "us": int(seconds * 1_000_000)}
                )
            return set(held)

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        async with self.db.connect() as conn:
            # One recoverer at a time; GET_LOCK belongs to the session, not the transaction,
            # so it is released by hand (or by the server when the connection dies).
            key = {"key": self.recovery_lock}
            if (await conn.execute(text("SELECT GET_LOCK(:key, 0)"), key)).scalar() != 1:
                await conn.rollback()
                return []
            try:
                ids = (await conn.execute(self.sql(_EXPIRED), {"limit": limit})).scalars().all()
                if ids:
                    await conn.execute(self._recover, {"ids": list(ids), "spread": spread})
                await conn.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.rollback()
                raise
            finally:
                try:
                    await conn.execute(text("SELECT RELEASE_LOCK(:key)"), key)
                    await conn.commit()
                except Exception:
                    # Never return a connection that may still hold the lock to the pool.
                    await conn.invalidate()
                    raise
            return list(ids)


def _loads(value: object) -> object:
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value
