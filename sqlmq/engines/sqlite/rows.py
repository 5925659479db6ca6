"""SQLite's hot-path rows: one statement straight on aiosqlite (:func:`fetch`), plain
tuples back, turned into deliveries after the commit (:func:`decoded`), times as SQLite
keeps them (ISO text, naive UTC), and the named rows of the channel statements."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from ...records import Delivery
from ..sql.kept_connections import driver_connection
from ..sql.rows import (
    BatchHeaders,
    BatchTimes,
    blob,
    decode_history,
    decode_rows,
    undecodable_delivery,
)
from .connections import NO_BUSY_WAIT

#: Marks a kept connection whose busy handler is off: its writes wait by
#: :func:`~sqlmq.engines.sqlite.connections.retry_refused` instead.
_NO_BUSY_WAIT = "sqlmq_no_busy_wait"


async def no_busy_wait(conn: AsyncConnection) -> None:
    """A kept connection's busy handler off (once): its writes are retried by
    :func:`~sqlmq.engines.sqlite.connections.retry_refused`, or given up, instead of waiting."""
    if not conn.info.get(_NO_BUSY_WAIT):
        await (await driver_connection(conn)).execute(NO_BUSY_WAIT)
        conn.info[_NO_BUSY_WAIT] = True


async def fetch(conn: AsyncConnection, sql: str, params: Mapping[str, Any]) -> list[Any]:
    """One statement straight on aiosqlite, in ``conn``'s transaction: a single trip to the
    driver's thread and plain tuples back, where SQLAlchemy's cursor takes three trips and
    processes every value. Errors come out wrapped as SQLAlchemy's, like the others."""
    with driver_errors(conn, sql):
        raw = await driver_connection(conn)
        return list(await raw.execute_fetchall(sql, params))


@contextlib.contextmanager
def driver_errors(conn: AsyncConnection, sql: str) -> Iterator[None]:
    """The driver's errors for ``sql``, wrapped as SQLAlchemy's, like every other
    statement's."""
    try:
        yield
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, None, exc, sqlite3.Error,
                                  dialect=conn.engine.dialect) from exc


def decoded(rows: list[Any], scheduled: Mapping[int, Any]) -> list[Delivery]:
    """The deliveries of taken rows (ACQUIRE_TAKE's columns), ``scheduled``: each one's due
    time; each distinct header text and time decoded once per batch."""
    headers, utc = BatchHeaders(), BatchTimes(stored_time)

    def decode(r: Any) -> Delivery:
        return Delivery(
            id=r[0],
            queue=r[1],
            headers=headers(r[2]),
            payload=blob(r[3]),
            attempts=r[4],
            deliveries=r[5],
            created_at=utc(r[6]),
            first_attempt_at=utc(r[7]),
            acquired_at=utc(r[8]),
            lease_expires_at=utc(r[9]),
            scheduled_at=utc(scheduled[r[0]]),
            history=decode_history(r[11]),
            priority=r[12],
            expires_at=utc(r[13]),
            saved_state=None if r[14] is None else blob(r[14]),
            defers=r[15],
            cancel_requested=bool(r[16]),
        )

    return decode_rows(rows, decode, _undecodable)


def _undecodable(r: Any, exc: BaseException) -> Delivery:
    return undecodable_delivery(r[0], r[1], r[4], r[5], exc)


#: How SQLite stores a time (naive UTC ISO text with microseconds, as SQLAlchemy writes it).
_STORED_TIME = "%Y-%m-%d %H:%M:%S.%f"


def stored_text(moment: datetime | None) -> str | None:
    """A moment as the text the SQL file's times are kept in (naive UTC, microseconds)."""
    return None if moment is None else moment.astimezone(UTC).strftime(_STORED_TIME)


def stored_time(value: str | datetime) -> datetime:
    """Stored ISO text (naive UTC) as an aware datetime."""
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    return parsed.replace(tzinfo=UTC)


class SlotRow(NamedTuple):
    """A row of SLOT_LIMITS, named as :func:`~..sql.room.effective` reads it."""

    name: str
    configured: int
    max_concurrency: int | None
    rate: float | None
    ordered: int | None
    max_size: int | None
    d_max_concurrency: int | None
    d_rate: float | None
    d_ordered: int | None
    d_max_size: int | None
    running: int


class DueRow(NamedTuple):
    """A row of DUE_PER_CHANNEL (``channel_due_at`` as stored: text, decoded by the
    take)."""

    id: int
    channel: str
    channel_due_at: str
    rn: int


class HeadRow(NamedTuple):
    """A row of NEXT_IN_ORDER (``channel_due_at`` as stored)."""

    id: int
    channel: str
    channel_due_at: str


class FairRow(NamedTuple):
    """A row of FAIR_PICK (``channel_due_at`` as stored: text, decoded by the take)."""

    id: int
    channel: str
    channel_due_at: str
    queue: str
    fair_key: int
    ordered: int
