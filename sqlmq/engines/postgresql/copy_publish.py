"""PostgreSQL's publish parameters: a batch as array literals for INSERT, or as a binary
COPY stream (the statements are in :mod:`sqlmq.engines.postgresql.statements`).

The arrays travel as text literals: the server parses them in C, where the drivers' array
adapters cost Python time per element. Headers go once per distinct set with each row's
index into them.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from ...lifecycle import State
from ...records import NewMessages


def insert_args(channel: str, messages: NewMessages) -> tuple[Any, ...]:
    """INSERT's (or INSERT_AT's) parameters for ``messages``: queue, header sets, keys,
    payloads, channel, the delay or the moment, the priority, then the expiry (moment,
    seconds)."""
    sets, keys = _headers_sets(messages.headers)
    return (messages.queue, _pg_texts(sets), keys, _pg_bytea(messages.payloads), channel,
            messages.delay if messages.at is None else messages.at, messages.priority,
            messages.expires_at, messages.expires_in)


def _pg_texts(values: Iterable[str]) -> str:
    return "{" + ",".join(
        '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values
    ) + "}"


def _pg_bytea(values: Iterable[bytes]) -> str:
    return "{" + ",".join('"\\\\x' + v.hex() + '"' for v in values) + "}"


def _headers_sets(headers: list[dict[str, str]]) -> tuple[list[str], str]:
    """The distinct header sets as JSON, and each message's (1-based) index into them, as an
    array literal. A batch shares one dict per content type (see
    :func:`sqlmq.publishing.prepare`): sets are told apart by identity, so equal dicts from
    elsewhere are merely sent twice."""
    index: dict[int, str] = {}
    sets: list[str] = []
    keys: list[str] = []
    last: dict[str, str] | None = None
    key = ""
    for h in headers:
        if h is not last:
            last = h
            found = index.get(id(last))
            if found is None:
                sets.append(json.dumps(last))
                found = index[id(last)] = str(len(sets))
            key = found
        keys.append(key)
    return sets, "{" + ",".join(keys) + "}"


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
                   "deliveries_count", "created_at", "next_attempt_at", "priority",
                   "expires_at")

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
# Per row: field count, then (length, value) per field: id (int8), then the payload's length.
_ROW_HEAD = struct.Struct(">hiqi").pack
_INT4_ZERO = struct.pack(">ii", 4, 0)
_NULL = struct.pack(">i", -1)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # timestamptz is microseconds since then
_MICROSECOND = timedelta(microseconds=1)
_CHUNK_BYTES = 256 * 1024  # the stream is cut here, so the server starts on it early


def pg_copy_args(channel: str, messages: NewMessages) -> tuple[Any, ...]:
    """COPY_RESERVE's parameters: count, at, delay, channel, queue, expiry (moment,
    seconds)."""
    return (len(messages), messages.at, messages.delay, channel, messages.queue,
            messages.expires_at, messages.expires_in)


def _field(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


def _timestamp(value: datetime) -> bytes:
    return struct.pack(">iq", 8, (value - _PG_EPOCH) // _MICROSECOND)


async def pg_copy_data(
    messages: NewMessages, ids: list[int], created_at: datetime,
    next_attempt_at: datetime, expires_at: datetime | None = None,
) -> AsyncIterator[bytes]:
    """The rows in PostgreSQL's binary COPY format (columns :data:`PG_COPY_COLUMNS`), in
    chunks. Every column but id and payload is the same for a whole batch save the headers,
    which differ only between content types: that tail is encoded once per headers set, and
    a row costs one ``struct.pack`` and a join in Python. The batch shares one priority,
    as it shares its queue, schedule and expiry."""
    if len(ids) != len(messages):
        raise ValueError(f"{len(ids)} ids for {len(messages)} messages")
    times = _timestamp(created_at) + _timestamp(next_attempt_at) + struct.pack(
        ">ii", 4, messages.priority) + (_NULL if expires_at is None else _timestamp(expires_at))
    queue = _field(messages.queue.encode("utf-8"))
    state = _field(State.PENDING.value.encode())
    tails: dict[int, bytes] = {}
    parts: list[bytes] = [_COPY_SIGNATURE]
    size = 0
    last_headers: dict[str, str] | None = None
    tail = b""
    for msg_id, payload, headers in zip(ids, messages.payloads, messages.headers, strict=True):
        if headers is not last_headers:
            last_headers = headers
            found = tails.get(id(headers))
            if found is None:  # jsonb's binary form is a version byte, then the JSON text
                found = tails[id(headers)] = (
                    queue + _field(b"\x01" + json.dumps(headers).encode("utf-8")) + state
                    + _INT4_ZERO + _INT4_ZERO + times
                )
            tail = found
        parts += (_ROW_HEAD(len(PG_COPY_COLUMNS), 8, msg_id, len(payload)), payload, tail)
        size += len(payload) + len(tail)
        if size >= _CHUNK_BYTES:
            yield b"".join(parts)
            parts.clear()
            size = 0
    parts.append(_COPY_TRAILER)
    yield b"".join(parts)
