"""Turning bodies into rows: validation, encoding, and the insert statement.

Publishing must work on sqlmq's own engine and on a caller's connection or session, sync or
async, so the statement is built here once and executed by whichever side owns the
transaction. On PostgreSQL a batch goes as arrays through ``unnest`` (one statement, no
per-row parameters); elsewhere as one multi-row INSERT.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, literal, text
from sqlalchemy.engine import CursorResult, Dialect

from .codec import CONTENT_TYPE, encode
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
    out = []
    for body in bodies:
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
        out.append(NewMessage(queue, payload, h, seconds, at))
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
_PG_BATCH = """
WITH inserted AS (
    INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                     created_at, next_attempt_at)
    SELECT :queue, CAST(h AS JSONB), p, 'PENDING', 0, 0, now(), {next_attempt_at}
    FROM unnest(CAST(CAST(:headers AS TEXT) AS TEXT[]), CAST(CAST(:payloads AS TEXT) AS BYTEA[]))
        WITH ORDINALITY AS u(h, p, n)
    ORDER BY n
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


def _headers_json(messages: list[NewMessage]) -> list[str]:
    # A batch usually repeats one set of headers: encode each distinct set once.
    seen: dict[tuple[tuple[str, str], ...], str] = {}
    out = []
    for m in messages:
        key = tuple(m.headers.items())
        text_ = seen.get(key)
        if text_ is None:
            text_ = seen[key] = json.dumps(m.headers)
        out.append(text_)
    return out


def pg_insert(schema: Schema, messages: list[NewMessage]) -> tuple[str, dict[str, Any]]:
    """PostgreSQL's insert (``:named`` parameters) and its parameters; the statement
    returns one row holding every new id, sorted."""
    first = messages[0]
    when = ":at" if first.at is not None else pg_now_plus(":delay")
    params: dict[str, Any] = {
        "queue": first.queue,
        "headers": _pg_texts(_headers_json(messages)),
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
