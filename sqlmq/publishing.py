"""Turning bodies into rows: validation, encoding, and the insert statement.

Publishing must work on sqlmq's own engine and on a caller's connection or session, sync or
async, so the statement is built here once and executed by whichever side owns the
transaction. On PostgreSQL a batch goes as arrays through ``unnest`` (one statement, no
per-row parameters); elsewhere as one multi-row INSERT. sqlmq's own PostgreSQL engine sends
large batches by binary ``COPY`` instead (see :func:`pg_copy_reserve`).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert, literal, text
from sqlalchemy.engine import CursorResult, Dialect

from .codec import BYTES_TYPE, CONTENT_TYPE, TEXT_TYPE, encode
from .errors import PayloadTooLarge, PublishError
from .notify import channel_for
from .records import NewMessage
from .retry import MAX_DELAY
from .schema import Schema
from .sqltime import db_now_plus, pg_now_plus
from .subscriber import check_queue


def _delay_seconds(delay: float | timedelta | None) -> float:
    if delay is None:
        return 0.0
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    if not isinstance(delay, int | float) or isinstance(delay, bool):
        raise PublishError(f"delay must be seconds or a timedelta, got {type(delay).__name__}")
    if math.isnan(delay) or math.isinf(delay):
        raise PublishError(f"delay must be a finite number of seconds, got {delay}")
    if delay < 0:
        raise PublishError(f"delay must not be negative, got {delay} seconds")
    if delay > MAX_DELAY:  # SQLite would store a NULL schedule, the others overflow
        raise PublishError(f"delay of {delay} seconds is over the limit of {MAX_DELAY:.0f}")
    return float(delay)


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise PublishError(f"headers must be a mapping of str to str, got {type(headers).__name__}")
    out: dict[str, str] = {}
    for key, value in headers.items():
        if not isinstance(key, str) or not key:
            raise PublishError(f"header names must be non-empty strings, got {key!r}")
        if not isinstance(value, str):
            raise PublishError(
                f"header {key!r} must be a string, got {type(value).__name__}"
            )
        if "\x00" in key or "\x00" in value:
            raise PublishError(f"header {key!r} contains a NUL character")
        try:
            key.encode("utf-8")
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise PublishError(
                f"header {key!r} is not valid Unicode text (it has a lone surrogate)"
            ) from None
        out[key] = value
    return out


def prepare(
    queue: str, bodies: Iterable[Any], *, headers: Mapping[str, str] | None,
    delay: float | timedelta | None, at: datetime | None, max_payload_bytes: int,
) -> list[NewMessage]:
    """Validate and encode everything before anything is written."""
    try:
        check_queue(queue)
    except Exception as exc:
        raise PublishError(str(exc)) from None
    seconds = _delay_seconds(delay)
    if at is not None:
        if delay is not None:
            raise PublishError("pass either delay or at, not both")
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise PublishError("at must be a timezone-aware datetime")
    base = _headers(headers)
    # Messages of one content type share one headers dict (read-only from here on).
    by_type: dict[str, dict[str, str]] = {}
    out: list[NewMessage] = []
    append = out.append
    for body in bodies:
        # bytes and str skip encode()'s general dispatch (same result: test_publish_pg_bulk
        # checks it); in a batch of small bodies that dispatch was a fifth of the client time.
        kind = type(body)
        if kind is bytes:
            payload, content_type = body, BYTES_TYPE
        elif kind is str:
            payload, content_type = body.encode("utf-8", "surrogatepass"), TEXT_TYPE
        else:
            payload, content_type = encode(body)
        if len(payload) > max_payload_bytes:
            raise PayloadTooLarge(
                f"payload of {len(payload)} bytes for queue {queue!r} exceeds the broker's "
                f"max_payload_bytes ({max_payload_bytes})"
            )
        h = by_type.get(content_type)
        if h is None:
            h = by_type[content_type] = dict(base)
            h.setdefault(CONTENT_TYPE, content_type)
        append(NewMessage(queue, payload, h, seconds, at))
    return out


@dataclass
class InsertPlan:
    statement: Any
    params: Any
    count: int
    uses_returning: bool

    ids_as_array: bool = False  # PostgreSQL: one row holding every id, sorted

    def ids(self, result: CursorResult[Any]) -> list[int]:
        if self.ids_as_array:
            return list(result.scalar_one())
        if self.uses_returning:
            return sorted(r[0] for r in result)
        # MySQL without RETURNING: one multi-row INSERT gets consecutive ids.
        first = result.lastrowid
        return list(range(first, first + self.count))


# The NOTIFY rides in the same statement, so it fires when (and only if) the transaction
# commits, on sqlmq's connection or the caller's. The arrays travel as text literals: the
# server parses them in C, where the drivers' array adapters cost Python time per element.
# Headers go once per distinct set (``hs``, parsed to JSONB once) with each row's index into
# it (``k``): parsing the JSON again for every row was a large part of the server's time.
_PG_BATCH = """
WITH inserted AS (
    INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                     created_at, next_attempt_at)
    SELECT :queue, (h.hs)[u.k], u.p, 'PENDING', 0, 0, now(), {next_attempt_at}
    FROM CAST(CAST(CAST(:headers AS TEXT) AS TEXT[]) AS JSONB[]) AS h(hs),
        unnest(CAST(CAST(:keys AS TEXT) AS INTEGER[]), CAST(CAST(:payloads AS TEXT) AS BYTEA[]))
        WITH ORDINALITY AS u(k, p, n)
    ORDER BY u.n
    RETURNING id
), woken AS MATERIALIZED (SELECT pg_notify(:channel, :queue))
SELECT array_agg(inserted.id ORDER BY inserted.id) FROM inserted, woken
"""


def _pg_texts(values: Iterable[str]) -> str:
    return "{" + ",".join(
        '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values
    ) + "}"


def _pg_bytea(values: Iterable[bytes]) -> str:
    return "{" + ",".join('"\\\\x' + v.hex() + '"' for v in values) + "}"


def _headers_sets(messages: list[NewMessage]) -> tuple[list[str], str]:
    """The distinct header sets as JSON, and each message's (1-based) index into them, as an
    array literal. A batch shares one dict per content type (see :func:`prepare`): sets are
    told apart by identity, so equal dicts from elsewhere are merely sent twice."""
    index: dict[int, str] = {}
    sets: list[str] = []
    keys: list[str] = []
    last: dict[str, str] | None = None
    key = ""
    for m in messages:
        if m.headers is not last:
            last = m.headers
            found = index.get(id(last))
            if found is None:
                sets.append(json.dumps(last))
                found = index[id(last)] = str(len(sets))
            key = found
        keys.append(key)
    return sets, "{" + ",".join(keys) + "}"


def pg_insert(schema: Schema, messages: list[NewMessage]) -> tuple[str, dict[str, Any]]:
    """PostgreSQL's insert (``:named`` parameters) and its parameters; the statement
    returns one row holding every new id, sorted."""
    first = messages[0]
    when = "CAST(:at AS TIMESTAMPTZ)" if first.at is not None else pg_now_plus(":delay")
    sets, keys = _headers_sets(messages)
    params: dict[str, Any] = {
        "queue": first.queue,
        "headers": _pg_texts(sets),
        "keys": keys,
        "payloads": _pg_bytea(m.payload for m in messages),
        "channel": channel_for(schema),
    }
    if first.at is not None:
        params["at"] = first.at
    else:
        params["delay"] = first.delay
    return _PG_BATCH.format(m=schema.message.name, next_attempt_at=when), params


def plan_insert(schema: Schema, dialect: Dialect, messages: list[NewMessage]) -> InsertPlan:
    """One statement for the batch; every message in it shares queue and schedule."""
    first = messages[0]
    if dialect.name == "postgresql":
        sql, params = pg_insert(schema, messages)
        stmt = text(sql)
        if first.at is not None:
            from sqlalchemy import bindparam

            from .schema import UTCDateTime

            stmt = stmt.bindparams(bindparam("at", type_=UTCDateTime()))
        return InsertPlan(stmt, params, len(messages), True, ids_as_array=True)
    t = schema.message
    when = first.at if first.at is not None else db_now_plus(literal(first.delay))
    if dialect.name == "sqlite" or bool(getattr(dialect, "is_mariadb", False)):
        # One statement with the per-row values as parameters: SQLAlchemy sends them as
        # multi-row INSERT ... RETURNING batches without compiling a statement per batch.
        stmt = insert(t).values(
            state="PENDING", attempts_count=0, deliveries_count=0,
            created_at=db_now_plus(literal(0.0)), next_attempt_at=when,
        ).returning(t.c.id)
        params = [{"queue": m.queue, "headers": m.headers, "payload": m.payload}
                  for m in messages]
        return InsertPlan(stmt, params, len(messages), True)
    rows = [
        {
            "queue": m.queue,
            "headers": m.headers,
            "payload": m.payload,
            "state": "PENDING",
            "attempts_count": 0,
            "deliveries_count": 0,
            "created_at": db_now_plus(literal(0.0)),
            "next_attempt_at": when,
        }
        for m in messages
    ]
    stmt = insert(t).values(rows)
    returning = dialect.name == "sqlite" or bool(getattr(dialect, "is_mariadb", False))
    if returning:
        stmt = stmt.returning(t.c.id)
    return InsertPlan(stmt, None, len(messages), returning)


# ---- PostgreSQL bulk path: binary COPY ------------------------------------------------------
#
# sqlmq's own engine sends large batches by COPY: measured against the INSERT above (batches
# of 5,000 and 50,000, interleaved), it takes from half to three quarters of the time. The
# client builds the stream at a quarter of a microsecond a row instead of hex-encoding text
# literals, and the server has no text arrays to parse, no RETURNING, no ids to aggregate and
# sort. What is left is mostly the server's own per-row work: heap, two indexes, WAL, the
# headers' JSON parse.
#
# COPY cannot return ids, so they are reserved first from the table's own sequence (nextval,
# safe against every other inserter), and the clock is read in that same statement:
# created_at and next_attempt_at are the database's now() of the publishing transaction,
# exactly what the INSERT writes. The NOTIFY is queued by that statement too, and fires at
# COMMIT, once the rows are visible, or never.

#: Batches at least this long go by COPY; smaller ones by the one-statement INSERT, whose
#: single round trip beats COPY's four (BEGIN, reserve, COPY, COMMIT).
PG_COPY_MIN = 200

#: The columns the COPY stream carries, in this order; the others keep their defaults (NULL).
PG_COPY_COLUMNS = ("id", "payload", "queue", "headers", "state", "attempts_count",
                   "deliveries_count", "created_at", "next_attempt_at")

_PG_RESERVE = """
SELECT now(), COALESCE(CAST($2 AS TIMESTAMPTZ),
                       now() + CAST($3 AS DOUBLE PRECISION) * INTERVAL '1 second'),
       ARRAY(SELECT nextval({sequence}) FROM generate_series(1, CAST($1 AS INTEGER))),
       pg_notify($4, $5)
"""

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
# Per row: field count, then (length, value) per field: id (int8), then the payload's length.
_ROW_HEAD = struct.Struct(">hiqi").pack
_INT4_ZERO = struct.pack(">ii", 4, 0)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # timestamptz is microseconds since then
_MICROSECOND = timedelta(microseconds=1)
_CHUNK_BYTES = 256 * 1024  # the stream is cut here, so the server starts on it early


def pg_copy_reserve(sequence: str) -> str:
    """The statement run before a COPY, with ``$1`` count, ``$2`` at (or NULL), ``$3`` delay,
    ``$4`` channel, ``$5`` queue. It returns ``(now, next_attempt_at, ids)`` and queues the
    NOTIFY; ``sequence`` is the name PostgreSQL gave the id column's sequence
    (``pg_get_serial_sequence``), spliced as a literal so it resolves once, at parse time."""
    return _PG_RESERVE.format(sequence="'" + sequence.replace("'", "''") + "'")


def pg_copy_args(schema: Schema, messages: list[NewMessage]) -> tuple[Any, ...]:
    """The reserve statement's parameters (see :func:`pg_copy_reserve`)."""
    first = messages[0]
    return (len(messages), first.at, first.delay, channel_for(schema), first.queue)


def _field(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


def _timestamp(value: datetime) -> bytes:
    return struct.pack(">iq", 8, (value - _PG_EPOCH) // _MICROSECOND)


async def pg_copy_data(
    messages: list[NewMessage], ids: list[int], created_at: datetime,
    next_attempt_at: datetime,
) -> AsyncIterator[bytes]:
    """The rows in PostgreSQL's binary COPY format (columns :data:`PG_COPY_COLUMNS`), in
    chunks. Every column but id and payload is the same for a whole batch save the headers,
    which differ only between content types: that tail is encoded once per headers set, and
    a row costs one ``struct.pack`` and a join in Python."""
    if len(ids) != len(messages):
        raise ValueError(f"{len(ids)} ids for {len(messages)} messages")
    times = _timestamp(created_at) + _timestamp(next_attempt_at)
    queue = _field(messages[0].queue.encode("utf-8"))
    state = _field(b"PENDING")
    tails: dict[int, bytes] = {}
    parts: list[bytes] = [_COPY_SIGNATURE]
    size = 0
    last_headers: dict[str, str] | None = None
    tail = b""
    for msg_id, m in zip(ids, messages, strict=True):
        if m.headers is not last_headers:
            last_headers = m.headers
            key = id(m.headers)
            found = tails.get(key)
            if found is None:  # jsonb's binary form is a version byte, then the JSON text
                found = tails[key] = (
                    queue + _field(b"\x01" + json.dumps(m.headers).encode("utf-8")) + state
                    + _INT4_ZERO + _INT4_ZERO + times
                )
            tail = found
        payload = m.payload
        parts += (_ROW_HEAD(len(PG_COPY_COLUMNS), 8, msg_id, len(payload)), payload, tail)
        size += len(payload) + len(tail)
        if size >= _CHUNK_BYTES:
            yield b"".join(parts)
            parts.clear()
            size = 0
    parts.append(_COPY_TRAILER)
    yield b"".join(parts)
