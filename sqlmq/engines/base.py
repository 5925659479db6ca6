"""The engine contract: every statement that touches message rows goes through one of these
methods, named after the lifecycle. One implementation per database lives beside this
file; dialect differences live there and nowhere else.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import TextClause, column, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..connect import READ_ONLY
from ..records import Delivery, NewMessage, QueueStats, Settlement
from ..schema import Schema, UTCDateTime
from ..states import Outcome


@runtime_checkable
class Engine(Protocol):
    """What the broker and the subscriber runtime need from a database.

    Every write after acquisition is fenced on ``(id, deliveries)`` and state PROCESSING:
    methods return the ids they actually wrote, and anything missing was stale.
    """

    dialect: str
    schema: Schema

    async def acquire(self, queues: Sequence[str], limit: int, lease: float) -> list[Delivery]:
        """Mark up to ``limit`` ready messages PROCESSING (one more delivery each, a lease of
        ``lease`` seconds) and return them in ``next_attempt_at`` order."""
        ...

    async def settle(self, settlements: Sequence[Settlement]) -> set[int]:
        """Apply a batch of results in one transaction; archive, retry or release."""
        ...

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        """Push the lease of each held ``(id, deliveries)`` to now + ``seconds``."""
        ...

    async def landed(self, settlements: Sequence[Settlement]) -> set[int]:
        """The ids among ``settlements`` whose result the database shows as written by
        exactly that delivery. A settle whose reply was lost (the connection died around
        its COMMIT) may have committed: retried, its rows are no longer PROCESSING and look
        stale, and this tells the runtime they were its own."""
        ...

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        """Return messages whose lease expired to PENDING, recording why.

        Each becomes ready at a random moment within ``spread`` seconds, so that messages
        which were prefetched beside a poison message do not travel with it into the next
        batch (and the next crash) again.
        """
        ...

    async def requeue_archived(
        self, *, queue: str | None = None, ids: Sequence[int] | None = None,
        state: str = "FAILED",
    ) -> int:
        """Move archived messages back to the table as fresh PENDING messages."""
        ...

    async def purge_archived(
        self, *, queue: str | None = None, state: str | None = None,
        before: datetime | None = None,
    ) -> int:
        ...

    async def stats(self) -> list[QueueStats]:
        ...

    async def now(self) -> datetime:
        ...

    def commit_counter(self) -> Callable[[], int | None] | None:
        """A cheap reading that changes whenever any connection, in any process, commits a
        write (None as a reading: it could not tell), so an idle subscriber can look far
        more often than it could acquire; None where the database offers no such thing."""
        ...


class KeptConnections:
    """A few autocommit connections the hot path keeps checked out of the pool and reuses.

    The pool's pre-ping costs a round trip per checkout (three on PostgreSQL), and a
    transaction through SQLAlchemy one more for its COMMIT; the hot path's statements
    commit themselves instead. A connection that fails is discarded, never kept, and one
    left idle for ``KEEP_FOR`` seconds goes back to the pool, whose pre-ping checks it
    before its next use (a server restart while it sat idle is then caught there).
    """

    db: AsyncEngine

    KEEP_IDLE = 4
    KEEP_FOR = 10.0
    #: Put the connections in autocommit; SQLite's are (see :mod:`sqlmq.connect`), and
    #: SQLAlchemy would undo that recipe when resetting the level at check-in.
    AUTOCOMMIT = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kept: list[tuple[AsyncConnection, float]] = []  # (connection, idle since)
        self._kept_closed = False

    async def _checkout(self) -> AsyncConnection:
        kept = self._kept
        now = time.monotonic()
        while kept:
            conn, since = kept.pop()
            if now - since < self.KEEP_FOR:
                return conn
            with contextlib.suppress(Exception):
                await self._release(conn)
        conn = await self.db.connect()
        if self.AUTOCOMMIT:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
        return conn

    async def _checkin(self, conn: AsyncConnection) -> None:
        if self._kept_closed or len(self._kept) >= self.KEEP_IDLE:
            await self._release(conn)
        else:
            self._kept.append((conn, time.monotonic()))

    async def close(self) -> None:
        """Return the kept connections to the pool; later calls do not keep any."""
        self._kept_closed = True
        while self._kept:
            with contextlib.suppress(Exception):
                await self._release(self._kept.pop()[0])

    async def _release(self, conn: AsyncConnection) -> None:
        """Give a connection back to the pool, as the pool's other users expect it: an
        engine that changed its session settings puts them back here."""
        await conn.close()


async def driver_connection(conn: AsyncConnection) -> Any:
    """The driver's own connection under ``conn``. ``get_raw_connection`` hops through a
    greenlet (about 30 µs, paid by every hot-path statement); a connection that is open and
    not invalidated already holds its driver connection, which is read without it."""
    sync = conn.sync_connection
    if sync is not None and not sync.closed and not sync.invalidated:
        return sync.connection.driver_connection
    return (await conn.get_raw_connection()).driver_connection


async def discard(conn: AsyncConnection) -> None:
    """Drop a connection that failed: never back into the pool as it is."""
    with contextlib.suppress(Exception):
        await conn.invalidate()
    with contextlib.suppress(Exception):
        await conn.close()


class SqlEngine:
    """Shared plumbing of the SQL engines: typed text statements and row conversion."""

    dialect = "generic"

    def __init__(self, db: AsyncEngine, schema: Schema) -> None:
        self.db = db
        self.schema = schema
        self.names = schema.names
        #: Names the lock that lets one process at a time recover expired leases.
        self.recovery_lock = f"sqlmq:recover:{schema.prefix}"
        self._types = {c.name: c.type for c in schema.message.c}
        self._types.update({c.name: c.type for c in schema.archive.c})
        self._types["scheduled_at"] = UTCDateTime()
        self._types["db_now"] = UTCDateTime()

    def commit_counter(self) -> Callable[[], int | None] | None:
        return None  # PostgreSQL has LISTEN; MySQL nothing as cheap as its acquire

    def sql(self, statement: str, *result_columns: str) -> TextClause:
        """A text statement with table names filled in and result columns typed."""
        clause = text(statement.format(**self.names))
        if result_columns:
            clause = clause.columns(*(column(n, self._types[n]) for n in result_columns))
        return clause

    @staticmethod
    def delivery(row: Any) -> Delivery:
        return Delivery(
            id=row.id,
            queue=row.queue,
            headers=_as_json(row.headers) or {},
            payload=bytes(row.payload),
            attempts=row.attempts_count,
            deliveries=row.deliveries_count,
            created_at=row.created_at,
            first_attempt_at=row.first_attempt_at,
            acquired_at=row.acquired_at,
            lease_expires_at=row.lease_expires_at,
            scheduled_at=row.scheduled_at,
            history=_as_json(row.history) or [],
        )

    @staticmethod
    def settlement_json(settlements: Sequence[Settlement]) -> str:
        """The batch as one JSON array parameter (for JSON_TABLE / json_each)."""
        return json.dumps(
            [
                [
                    s.id,
                    s.deliveries,
                    s.outcome.value,
                    s.error,
                    s.delay,
                    1 if s.refund else 0,
                    1 if s.attempted else 0,
                    None if s.history is None else json.dumps(s.history),
                ]
                for s in settlements
            ]
        )


def _as_json(value: Any) -> Any:
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value


DELIVERY_COLUMNS = (
    "id", "queue", "headers", "payload", "attempts_count", "deliveries_count", "created_at",
    "first_attempt_at", "acquired_at", "lease_expires_at", "scheduled_at", "history",
)
STATS_COLUMNS = ("queue", "state", "n", "oldest")


class ArchiveAndStatsMixin:
    """Statements off the hot path, written once in SQLAlchemy Core for every database."""

    db: AsyncEngine
    schema: Schema

    async def now(self) -> datetime:
        from sqlalchemy import literal, select

        from ..sqltime import db_now_plus

        async with self.db.connect() as conn:
            await conn.execution_options(**{READ_ONLY: True})
            return (await conn.execute(select(db_now_plus(literal(0.0))))).scalar_one()

    def _archive_filter(
        self, queue: str | None, ids: Sequence[int] | None, state: str | None,
        before: datetime | None,
    ) -> list[Any]:
        a = self.schema.archive
        where: list[Any] = []
        if queue is not None:
            where.append(a.c.queue == queue)
        if ids is not None:
            where.append(a.c.id.in_(list(ids)))
        if state is not None:
            where.append(a.c.state == state)
        if before is not None:
            where.append(a.c.archived_at < before)
        return where

    async def landed(self, settlements: Sequence[Settlement]) -> set[int]:
        from sqlalchemy import select

        a, m = self.schema.archive, self.schema.message
        ended = [s.id for s in settlements if s.outcome.archives]
        back = [s.id for s in settlements if not s.outcome.archives]
        async with self.db.connect() as conn:
            await conn.execution_options(**{READ_ONLY: True})
            archived = {r.id: r for r in await conn.execute(
                select(a.c.id, a.c.state, a.c.deliveries_count).where(a.c.id.in_(ended))
            )} if ended else {}
            queued = {r.id: r for r in await conn.execute(
                select(m.c.id, m.c.state, m.c.deliveries_count, m.c.lease_expires_at,
                       m.c.history).where(m.c.id.in_(back))
            )} if back else {}
        return {s.id for s in settlements
                if _shows(s, archived.get(s.id) if s.outcome.archives else queued.get(s.id))}

    async def requeue_archived(
        self, *, queue: str | None = None, ids: Sequence[int] | None = None,
        state: str = "FAILED",
    ) -> int:
        from sqlalchemy import delete, insert, literal, select

        from ..sqltime import db_now_plus

        a, m = self.schema.archive, self.schema.message
        where = self._archive_filter(queue, ids, state, None)
        async with self.db.begin() as conn:
            # Lock the archive rows first so a concurrent requeue cannot copy them twice.
            locked = select(a.c.id).where(*where).with_for_update()
            if self.db.dialect.name == "sqlite":
                locked = select(a.c.id).where(*where)  # BEGIN IMMEDIATE already serialises
            picked = list((await conn.execute(locked)).scalars())
            if not picked:
                return 0
            moved = 0
            for start in range(0, len(picked), 500):
                chunk = picked[start : start + 500]
                src = select(
                    a.c.id, a.c.queue, a.c.headers, a.c.payload, literal("PENDING"),
                    literal(0), literal(0), a.c.created_at, db_now_plus(literal(0.0)),
                    a.c.error, a.c.history,
                ).where(a.c.id.in_(chunk))
                await conn.execute(
                    insert(m).from_select(
                        ["id", "queue", "headers", "payload", "state", "attempts_count",
                         "deliveries_count", "created_at", "next_attempt_at", "last_error",
                         "history"],
                        src,
                    )
                )
                moved += (await conn.execute(delete(a).where(a.c.id.in_(chunk)))).rowcount
            return moved

    async def purge_archived(
        self, *, queue: str | None = None, state: str | None = None,
        before: datetime | None = None,
    ) -> int:
        from sqlalchemy import delete

        a = self.schema.archive
        async with self.db.begin() as conn:
            result = await conn.execute(
                delete(a).where(*self._archive_filter(queue, None, state, before))
            )
            return result.rowcount

    async def stats(self) -> list[QueueStats]:
        from sqlalchemy import func, select

        m, a = self.schema.message, self.schema.archive
        counts: dict[str, dict[str, Any]] = {}
        async with self.db.connect() as conn:
            await conn.execution_options(**{READ_ONLY: True})
            live = await conn.execute(
                select(m.c.queue, m.c.state, func.count(), func.min(m.c.next_attempt_at))
                .group_by(m.c.queue, m.c.state)
            )
            for queue, state, n, oldest in live:
                q = counts.setdefault(queue, {"oldest": None})
                q[state] = n
                if oldest is not None and (q["oldest"] is None or oldest < q["oldest"]):
                    q["oldest"] = oldest
            done = await conn.execute(
                select(a.c.queue, a.c.state, func.count()).group_by(a.c.queue, a.c.state)
            )
            for queue, state, n in done:
                counts.setdefault(queue, {"oldest": None})[state] = n
        return [
            QueueStats(
                queue=q,
                pending=c.get("PENDING", 0),
                processing=c.get("PROCESSING", 0),
                retryable=c.get("RETRYABLE", 0),
                completed=c.get("COMPLETED", 0),
                failed=c.get("FAILED", 0),
                oldest_ready_at=c["oldest"],
            )
            for q, c in sorted(counts.items())
        ]


def _shows(s: Settlement, row: Any) -> bool:
    """Whether ``row`` (the archive row for an ending, else the message row) is what
    settlement ``s`` leaves. Only the holder of delivery ``(id, deliveries)`` can write it:
    an archive row or a RETRYABLE row with that delivery number; for a refunded release,
    PENDING one delivery back (a lease recovery never refunds); for another release, PENDING
    at that delivery without the ``lease_expired`` entry a recovery would have added."""
    if row is None:
        return False
    if s.outcome.archives:
        return bool(row.state == s.outcome.value and row.deliveries_count == s.deliveries)
    if s.outcome is Outcome.RETRY:
        return bool(row.state == "RETRYABLE" and row.deliveries_count == s.deliveries)
    if row.state != "PENDING" or row.lease_expires_at is not None:
        return False
    if s.refund:
        return bool(row.deliveries_count == s.deliveries - 1)
    last = (_as_json(row.history) or [{}])[-1]
    recovered = isinstance(last, dict) and last.get("ended") == "lease_expired" and \
        last.get("delivery") == s.deliveries
    return bool(row.deliveries_count == s.deliveries and not recovered)


# ---- decoding a batch of rows (the MariaDB and SQLite engines read plain tuples) -------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ready_order(d: Delivery) -> tuple[datetime, int]:
    """The order acquire hands messages out in: by schedule, then id."""
    return (d.scheduled_at or _EPOCH, d.id)


class RowDecodeError(ValueError):
    """A column of an acquired row that does not hold what sqlmq wrote there (a hand edit,
    another writer, a bad migration); the message names the column and the problem."""


class BatchHeaders(dict[Any, dict[str, str]]):
    """Decodes the headers of one batch, each distinct text once: messages published
    together mostly carry the same headers. Every message gets its own dict (a handler may
    change it); headers map strings to strings, so a shallow copy is a full one."""

    def __call__(self, value: str | bytes | None) -> dict[str, str]:
        if value is None:
            return {}
        decoded = self.get(value)
        if decoded is None:
            decoded = self[value] = _headers(value)
        return dict(decoded)


def _headers(value: Any) -> dict[str, str]:
    """Checked once per distinct text: the runtime and handlers rely on string values."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowDecodeError(f"headers are not valid JSON: {exc}") from None
    value = value or {}
    if not isinstance(value, dict):
        raise RowDecodeError(f"headers are a JSON {_json_kind(value)}, not an object")
    for key, item in value.items():
        if not isinstance(item, str):
            raise RowDecodeError(f"header {key!r} is a JSON {_json_kind(item)}, not a string")
    return value


def decode_history(value: Any) -> list[dict[str, Any]]:
    """A row's ``history`` column: a JSON array of objects (the runtime reads their keys)."""
    if value is None:
        return []
    if isinstance(value, str | bytes):
        if value == "[]":
            return []
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowDecodeError(f"history is not valid JSON: {exc}") from None
    if not isinstance(value, list):
        raise RowDecodeError(f"history is a JSON {_json_kind(value)}, not an array")
    for entry in value:
        if not isinstance(entry, dict):
            raise RowDecodeError(f"history holds a JSON {_json_kind(entry)}, not an object")
    return value


def blob(value: Any) -> bytes:
    """A row's ``payload``, which sqlmq always writes as a BLOB (SQLite lets a hand edit store
    TEXT or a number there instead)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    kind = "TEXT" if isinstance(value, str) else type(value).__name__
    raise RowDecodeError(f"payload is stored as {kind}, not as a BLOB")


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def decode_rows(rows: Sequence[Any], decode: Callable[[Any], Delivery],
                undecodable: Callable[[Any, BaseException], Delivery]) -> list[Delivery]:
    """Deliveries from the rows of one acquire. The rows are already PROCESSING when they
    are decoded, so a row that fails must not take its batch down with it: the whole batch
    is decoded at once (the hot path), and only if that fails is each row decoded alone,
    those that fail becoming ``undecodable(row, error)`` (a delivery with ``defect`` set,
    which the runtime archives FAILED through the usual fenced settle)."""
    try:
        return [decode(r) for r in rows]
    except Exception:
        pass
    out = []
    for r in rows:
        try:
            out.append(decode(r))
        except Exception as exc:
            out.append(undecodable(r, exc))
    return out


def undecodable_delivery(msg_id: int, queue: str, attempts: int, deliveries: int,
                         exc: BaseException) -> Delivery:
    """The delivery of a row that could not be decoded: its fencing token and counters, and
    the reason; nothing else of it is read."""
    reason = str(exc) if isinstance(exc, RowDecodeError) else f"{type(exc).__name__}: {exc}"
    return Delivery(msg_id, queue, {}, b"", attempts, deliveries, _EPOCH, None, _EPOCH, _EPOCH,
                    _EPOCH, [], f"undecodable row: {reason}"[:2000])


def leased_delivery(message: NewMessage, msg_id: int, now: datetime,
                    lease_expires_at: datetime) -> Delivery:
    """The delivery of a message published already acquired (``insert_leased``): the row
    an acquire at ``now`` would have left, its first delivery."""
    return Delivery(msg_id, message.queue, dict(message.headers), message.payload, 0, 1, now,
                    now, now, lease_expires_at, now, [])


class BatchTimes(dict[Any, datetime]):
    """The driver's values of one batch's timestamps as aware UTC datetimes, each distinct
    value converted once: a batch's rows share their acquisition and lease times, and often
    their creation and schedule (datetimes are immutable, so sharing them is safe)."""

    def __init__(self, convert: Callable[[Any], datetime]) -> None:
        super().__init__()
        self.convert = convert

    def __call__(self, value: Any) -> Any:
        if value is None:
            return None
        converted = self.get(value)
        if converted is None:
            try:
                converted = self[value] = self.convert(value)
            except Exception as exc:  # e.g. text that is no date, 'infinity' on PostgreSQL
                raise RowDecodeError(f"malformed timestamp {value!r}: {exc}") from None
        return converted

