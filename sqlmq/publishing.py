"""Turning bodies into rows: validation and encoding, before anything is written.

:func:`prepare` gives the :class:`~sqlmq.records.NewMessages` batch every engine's
``publish`` takes; how they are inserted is each engine's business (see
:mod:`sqlmq.engines`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from .codec import BYTES_TYPE, CONTENT_TYPE, TEXT_TYPE, encode
from .errors import PayloadTooLarge, PublishError
from .records import NewMessages
from .retry import MAX_DELAY
from .schema import MAX_DEDUP_KEY, MAX_PRIORITY, MIN_PRIORITY
from .subscriber import check_name, check_queue


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


def _expiry(expires: float | timedelta | datetime | None) -> tuple[float | None,
                                                                    datetime | None]:
    """``(expires_in, expires_at)`` of a publish's ``expires``: seconds or a timedelta from
    the database's now, or a moment (timezone-aware)."""
    if expires is None:
        return None, None
    if isinstance(expires, datetime):
        if expires.tzinfo is None:
            raise PublishError("expires must be a timezone-aware datetime, seconds or a "
                               "timedelta")
        return None, expires
    if isinstance(expires, timedelta):
        expires = expires.total_seconds()
    if not isinstance(expires, int | float) or isinstance(expires, bool):
        raise PublishError(f"expires must be seconds, a timedelta or a datetime, got "
                           f"{type(expires).__name__}")
    if math.isnan(expires) or math.isinf(expires) or not 0 < expires <= MAX_DELAY:
        raise PublishError(f"expires must be more than 0 and at most {MAX_DELAY:.0f} seconds, "
                           f"got {expires}")
    return float(expires), None


def _priority(priority: int) -> int:
    """An int (not a bool) in ``MIN_PRIORITY..MAX_PRIORITY``: higher is taken first."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise PublishError(f"priority must be an int, got {type(priority).__name__}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise PublishError(
            f"priority must be from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority}")
    return int(priority)  # an int subclass (an IntEnum) goes to the driver as a plain int


def _dedup_key(key: str | None) -> str | None:
    """None, or a key the database stores and compares exactly as given."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise PublishError(f"a dedup key must be a string, got {type(key).__name__}")
    if not 0 < len(key) <= MAX_DEDUP_KEY:
        raise PublishError(f"a dedup key must have 1 to {MAX_DEDUP_KEY} characters, got "
                           f"{len(key)}")
    _check_text(f"dedup key {key!r}", key)
    return key


def _dedup_keys(keys: Sequence[str | None] | None, count: int) -> list[str | None] | None:
    """One key (or None) per message, or None when no message has one."""
    if keys is None:
        return None
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise PublishError(f"dedup_keys must be a sequence with a key (or None) per message, "
                           f"got {type(keys).__name__}")
    if len(keys) != count:
        raise PublishError(f"dedup_keys has {len(keys)} keys for {count} messages")
    out = [_dedup_key(k) for k in keys]
    return out if any(k is not None for k in out) else None


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
        _check_text(f"header {key!r}", key, value)
        out[key] = value
    return out


def _own_headers(each: Any, typed: list[dict[str, str]]) -> list[dict[str, str]]:
    """Headers of each message of its own (a sequence of mappings, one per body, as an
    inbox takes them from a far broker), over the shared ones and the content type its body
    was given: a ``content-type`` of its own wins, as a shared mapping's does."""
    if isinstance(each, str | bytes) or not isinstance(each, Sequence):
        raise PublishError(f"headers must be a mapping of str to str, or a sequence of them "
                           f"with one per message, got {type(each).__name__}")
    if len(each) != len(typed):
        raise PublishError(f"headers has {len(each)} mappings for {len(typed)} messages")
    return [{**t, **_headers(h)} for t, h in zip(typed, each, strict=True)]


def _check_text(what: str, *texts: str) -> None:
    """Text every database stores as given: no NUL (PostgreSQL refuses it in text, others
    cut there), valid Unicode (a lone surrogate cannot be encoded). ``what`` names it."""
    if any("\x00" in t for t in texts):
        raise PublishError(f"{what} contains a NUL character")
    try:
        for t in texts:
            t.encode("utf-8")
    except UnicodeEncodeError:
        raise PublishError(f"{what} is not valid Unicode text (it has a lone surrogate)"
                           ) from None


def check_executor(executor: Any, *, asynchronous: bool) -> Any:
    """A publish's ``connection=``: None, the caller's SQLAlchemy connection or session of
    the right kind (returned as it is), or the caller's own connection of a database driver
    of the right kind (returned wrapped for the engine: see
    :func:`sqlmq.engines.driver_connection_of`). The engine checks that it is to the
    broker's kind of database, and in a transaction."""
    if executor is None:
        return None
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    from .engines import driver_connection_of

    if isinstance(executor, AsyncConnection | AsyncSession):
        if asynchronous:
            return executor
    elif isinstance(executor, Connection | Session):
        if not asynchronous:
            return executor
    else:
        driver = driver_connection_of(executor)
        if driver is not None and driver.ASYNCHRONOUS == asynchronous:
            return driver
        if driver is None:
            raise PublishError(
                f"connection= takes {_ASYNC_KINDS if asynchronous else _SYNC_KINDS}, got "
                f"{type(executor).__module__}.{type(executor).__name__}")
    if asynchronous:
        raise PublishError(f"publish() takes {_ASYNC_KINDS}, got {type(executor).__name__}; "
                           "use publish_sync() with a sync one")
    raise PublishError(f"publish_sync() takes {_SYNC_KINDS}, got {type(executor).__name__}; "
                       "use await publish() with an async one")


_ASYNC_KINDS = ("an AsyncConnection or AsyncSession, or an asyncpg, psycopg (AsyncConnection), "
                "aiosqlite or asyncmy connection")
_SYNC_KINDS = ("a sync Connection or Session, or a psycopg, sqlite3 or PyMySQL connection")


def prepare(
    queue: str, bodies: Iterable[Any], *, headers: Mapping[str, str] | None,
    delay: float | timedelta | None, at: datetime | None, max_payload_bytes: int,
    priority: int = 0, expires: float | timedelta | datetime | None = None,
    dedup_keys: Sequence[str | None] | None = None, channel: str | None = None,
    headers_each: Sequence[Mapping[str, str]] | None = None,
) -> NewMessages:
    """Validate and encode everything before anything is written. ``dedup_keys``: one per
    body (see :mod:`sqlmq.engines.sql.publish`). ``headers_each``: headers of each message
    of its own, one mapping per body, over ``headers`` (see :func:`_own_headers`)."""
    try:
        check_queue(queue)
        if channel is not None:
            check_name(channel, "channel name")
    except Exception as exc:
        raise PublishError(str(exc)) from None
    seconds = _delay_seconds(delay)
    priority = _priority(priority)
    expires_in, expires_at = _expiry(expires)
    if at is not None:
        if delay is not None:
            raise PublishError("pass either delay or at, not both")
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise PublishError("at must be a timezone-aware datetime")
    base = _headers(headers)
    # Messages of one content type share one headers dict (read-only from here on).
    by_type: dict[str, dict[str, str]] = {}
    payloads: list[bytes] = []
    shared: list[dict[str, str]] = []
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
        payloads.append(payload)
        shared.append(h)
    if headers_each is not None:
        shared = _own_headers(headers_each, shared)
    return NewMessages(queue, payloads, shared, seconds, at, priority, expires_in, expires_at,
                       _dedup_keys(dedup_keys, len(payloads)), channel)
