"""Publishing through SQLAlchemy Core: batches where an engine has no faster path, every
publish in the caller's transaction on MySQL and SQLite, and every publish with
deduplication keys, on sqlmq's connections or the caller's.

A publish is a *flow*: a generator that yields ``(statement, parameters)`` and is sent each
statement's result, returning the ids in the messages' order. :func:`run_flow` and
:func:`run_flow_sync` run one on an async or a sync connection, so both kinds of caller
share one account of what is written.

**Deduplication keys.** At most one message per key waits or runs in a queue: a unique
index on ``(queue, dedup_key)`` over the message table (``ux_{prefix}message_dedup``) says
so, and the database enforces it against every publisher, in this process or another, in
sqlmq's transactions or the caller's. An archived message has left the table, so its key is
free again. A publish whose key is taken writes nothing and returns the id of the message
holding it, as :class:`~sqlmq.records.Published` with ``duplicate`` true. Two transactions
publishing one key: the database makes the second insert wait for the first transaction;
committed, the second is a duplicate; rolled back, the second inserts.

Each database skips a taken key its own way:

* PostgreSQL and SQLite: ``INSERT … ON CONFLICT DO NOTHING RETURNING id, dedup_key``
  returns the rows it inserted; the ids holding the other keys are read after. DO NOTHING
  locks nothing, so on PostgreSQL a message can be archived between the two statements,
  freeing its key: the insert is tried again for the keys read as missing.
* MySQL and MariaDB: ``INSERT … ON DUPLICATE KEY UPDATE`` with an update that changes
  nothing but notes the duplicate's id in a session variable (the affected-row count cannot
  tell, since SQLAlchemy's drivers count found rows), a row at a time, its id (its own or
  the holder's) read from LAST_INSERT_ID. The update
  locks the row it meets: a duplicate publish in a long transaction of the caller's makes
  a consumer settling that message wait for its commit. InnoDB checks a unique key with
  next-key locks, so publishers of overlapping keys can deadlock (error 1213): sqlmq runs
  its own transaction again (a keyed publish repeated is harmless), the caller's is the
  caller's to run again, as any MySQL transaction.

A key met twice in one batch is sent once; the later messages are its duplicates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from sqlalchemy import Float, Table, bindparam, insert, literal, literal_column, select, text
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from ...channels import Turns
from ...errors import PublishError
from ...lifecycle import State
from ...records import NewMessage, NewMessages, Published
from ...sqltime import db_now_plus

#: Rows per multi-row INSERT.
CHUNK = 1000
#: Tries of a keyed publish: its inserts on PostgreSQL, where a key found missing after an
#: insert skipped it had been archived in between (freed, so tried again), and its runs in
#: sqlmq's own transaction when the database chooses it as a deadlock's victim.
KEYED_TRIES = 5

T = TypeVar("T")
Step = tuple[Executable, Any]
#: Yields statements with their parameters, is sent their results, returns the ids.
Flow = Generator[Step, Any, list[int]]


def run_flow_sync(conn: Connection, flow: Flow) -> list[int]:
    result: Any = None
    try:
        while True:
            statement, params = flow.send(result)
            result = conn.execute(statement, params)
    except StopIteration as done:
        return done.value


async def run_flow(conn: AsyncConnection, flow: Generator[Step, Any, T]) -> T:
    result: Any = None
    try:
        while True:
            statement, params = flow.send(result)
            result = await conn.execute(statement, params)
    except StopIteration as done:
        return done.value


def pending_values(messages: NewMessage | NewMessages) -> dict[str, Any]:
    """The columns a publish sets alike on all its rows, the schedule and the expiry on the
    database clock, as SQL expressions with the values in them: MySQL 8's multi-row INSERT
    (no RETURNING) takes each row's values this way. The other inserts use the cached
    statements of :func:`_insert`, with the values as parameters."""
    when = messages.at if messages.at is not None else db_now_plus(literal(messages.delay))
    values = {"state": State.PENDING.value, "attempts_count": 0, "deliveries_count": 0,
              "created_at": db_now_plus(literal(0.0)), "next_attempt_at": when,
              "priority": messages.priority, "expires_at": expires_at_of(messages)}
    if messages.channel is not None:  # due apart from the plain ones (see sqlmq.channels)
        values.update(next_attempt_at=None, channel=messages.channel, channel_due_at=when)
    return values


def expires_at_of(messages: NewMessage | NewMessages) -> Any:
    """The ``expires_at`` a publish stores: the moment given, now plus the seconds given on
    the database clock, or NULL."""
    if messages.expires_in is not None:
        return db_now_plus(literal(messages.expires_in))
    return messages.expires_at


#: An insert's shape (:func:`_shape`): a channel's messages; due after a delay (else at a
#: moment); expiring after a number of seconds (else at a moment, or never).
Shape = tuple[bool, bool, bool]
#: A channel message's place in the fair order: its ``fair_key`` and ``ordered`` columns.
Fair = dict[str, int]


def _shape(messages: NewMessages) -> Shape:
    return (messages.channel is not None, messages.at is None, messages.expires_in is not None)


def _shared(messages: NewMessages) -> dict[str, Any]:
    """The parameters every row of a publish of ``messages`` shares, for the statements of
    :func:`_insert`: the plain columns' values, and the seconds its SQL expressions add to
    the database clock."""
    channel = messages.channel is not None
    row: dict[str, Any] = {"queue": messages.queue, "state": State.PENDING.value,
                           "attempts_count": 0, "deliveries_count": 0,
                           "priority": messages.priority}
    if messages.at is None:
        row["p_delay"] = messages.delay
    else:
        row["channel_due_at" if channel else "next_attempt_at"] = messages.at
    if messages.expires_in is None:
        row["expires_at"] = messages.expires_at
    else:
        row["p_expires_in"] = messages.expires_in
    if channel:
        row["channel"] = messages.channel
    return row


@functools.lru_cache(maxsize=256)
def _insert(table: Table, dialect: str, shape: Shape, keyed: bool) -> Any:
    """The INSERT … RETURNING of one shape of publish, built once: a statement made anew on
    every publish is made, and keyed for SQLAlchemy's cache, anew each time, which was
    most of a Core publish's time (see ``bench.publish_paths``).
    The rows' values are parameters (:func:`_shared` and the rows' own); the database's
    clock, and the seconds added to it, are the SQL expressions. ``keyed``: the
    deduplicating insert of :func:`_on_conflict`, or, on MySQL and MariaDB, of
    :func:`_on_duplicate` (which returns nothing)."""
    channel, delayed, expiring = shape
    c = table.c
    values: dict[str, Any] = {"created_at": db_now_plus(literal(0.0))}
    if delayed:
        due = db_now_plus(bindparam("p_delay", type_=Float()))
        values["channel_due_at" if channel else "next_attempt_at"] = due
    if expiring:
        values["expires_at"] = db_now_plus(bindparam("p_expires_in", type_=Float()))
    if not keyed:
        return insert(table).values(**values).returning(c.id)
    if dialect in ("mysql", "mariadb"):
        return (mysql_dialect.insert(table).values(**values)
                .on_duplicate_key_update(id=literal_column(_NOTE_DUPLICATE)))
    return (_CONFLICT_INSERTS[dialect](table).values(**values)
            .on_conflict_do_nothing(index_elements=[c.queue, c.dedup_key],
                                    index_where=c.dedup_key.isnot(None))
            .returning(c.dedup_key, c.id))


def publish_flow(table: Table, dialect: Dialect, messages: NewMessages,
                 wake: Step | None = None, turns: Turns | None = None) -> Flow:
    """Insert ``messages`` (ids in order); ``wake``, if any, runs once something is
    written (PostgreSQL's NOTIFY). ``turns``: a channel's messages' turns (see
    :mod:`sqlmq.channels`)."""
    fair = (None if turns is None else
            [{"fair_key": turns.key(messages.priority, i), "ordered": int(turns.ordered)}
             for i in range(len(messages))])
    if messages.dedup_keys is None:
        ids = yield from _plain(table, dialect, messages, fair)
    else:
        ids = yield from _keyed(table, dialect, messages, fair)
    if wake is not None and not all(getattr(i, "duplicate", False) for i in ids):
        yield wake
    return ids


def _plain(table: Table, dialect: Dialect, messages: NewMessages,
           fair: list[Fair] | None = None) -> Flow:
    """Where the database returns ids (PostgreSQL, SQLite, MariaDB), one cached statement
    (:func:`_insert`) with the per-row values as parameters: SQLAlchemy sends it as
    multi-row INSERT … RETURNING batches without compiling a statement per batch. MySQL 8
    has no RETURNING: one multi-row INSERT per chunk, whose ids are consecutive."""
    ids: list[int] = []
    returning = dialect.insert_returning
    statement = _insert(table, dialect.name, _shape(messages), False) if returning else None
    shared = _shared(messages) if returning else pending_values(messages)
    for i in range(0, len(messages), CHUNK):
        c = messages[i : i + CHUNK]
        rows = [{**shared, "headers": h, "payload": p}
                for p, h in zip(c.payloads, c.headers, strict=True)]
        if fair is not None:
            for row, f in zip(rows, fair[i : i + CHUNK], strict=True):
                row.update(f)
        if statement is not None:
            result = yield statement, rows
            ids += sorted(r[0] for r in result)
        else:
            result = yield insert(table).values([{"queue": c.queue, **r} for r in rows]), None
            ids += range(result.lastrowid, result.lastrowid + len(rows))
    return ids


def _keyed(table: Table, dialect: Dialect, messages: NewMessages,
           fair: list[Fair] | None) -> Flow:
    keys = messages.dedup_keys
    assert keys is not None
    out: list[int | None] = [None] * len(messages)
    plain = [i for i, k in enumerate(keys) if k is None]
    if plain:
        ids = yield from _plain(table, dialect, messages.pick(plain),
                                None if fair is None else [fair[i] for i in plain])
        for i, msg_id in zip(plain, ids, strict=True):
            out[i] = msg_id
    first: dict[str, int] = {}  # each key's first message
    for i, k in enumerate(keys):
        if k is not None:
            first.setdefault(k, i)
    # in key order: two batches sharing keys lock them in the same order, never crosswise
    first = dict(sorted(first.items()))
    if dialect.name in ("mysql", "mariadb"):
        held = yield from _on_duplicate(table, dialect.name, messages, first, fair)
    else:
        held = yield from _on_conflict(table, dialect, messages, first, fair)
    for i, k in enumerate(keys):
        if k is not None:
            msg_id, duplicate = held[k]
            out[i] = Published(msg_id, duplicate or first[k] != i)
    return [i for i in out if i is not None]


def _keyed_rows(messages: NewMessages, first: dict[str, int],
                fair: list[Fair] | None) -> list[dict[str, Any]]:
    shared = _shared(messages)
    rows = [{**shared, "headers": messages.headers[i], "payload": messages.payloads[i],
             "dedup_key": k} for k, i in first.items()]
    if fair is not None:
        for row, i in zip(rows, first.values(), strict=True):
            row.update(fair[i])
    return rows


@functools.lru_cache(maxsize=64)
def _holders(table: Table) -> Executable:
    """``(dedup_key, id)`` of the rows holding the keys ``keys`` in queue ``p_queue``."""
    c = table.c
    return select(c.dedup_key, c.id).where(
        c.queue == bindparam("p_queue"), c.dedup_key.in_(bindparam("keys", expanding=True)))


_CONFLICT_INSERTS: dict[str, Callable[[Table], Any]] = {
    "postgresql": pg_dialect.insert, "sqlite": sqlite_dialect.insert}


def _on_conflict(table: Table, dialect: Dialect, messages: NewMessages,
                 first: dict[str, int], fair: list[Fair] | None,
                 ) -> Generator[Step, Any, dict[str, tuple[int, bool]]]:
    statement = _insert(table, dialect.name, _shape(messages), True)
    held: dict[str, tuple[int, bool]] = {}
    todo = dict(first)
    for _ in range(KEYED_TRIES):
        for start in range(0, len(todo), CHUNK):
            chunk = dict(list(todo.items())[start : start + CHUNK])
            result = yield statement, _keyed_rows(messages, chunk, fair)
            held.update((k, (msg_id, False)) for k, msg_id in result)
        missing = [k for k in todo if k not in held]
        for start in range(0, len(missing), CHUNK):
            result = yield (_holders(table), {"p_queue": messages.queue,
                                              "keys": missing[start : start + CHUNK]})
            held.update((k, (msg_id, True)) for k, msg_id in result)
        todo = {k: todo[k] for k in missing if k not in held}
        if not todo:
            return held
    raise PublishError(f"publishing to {messages.queue!r}: the messages holding keys "
                       f"{sorted(todo)[:5]} kept being archived while this publish looked "
                       f"for them ({KEYED_TRIES} tries); nothing of theirs was written")


def _on_duplicate(table: Table, dialect: str, messages: NewMessages, first: dict[str, int],
                  fair: list[Fair] | None,
                  ) -> Generator[Step, Any, dict[str, tuple[int, bool]]]:
    """A row at a time: its id, its own or the holder's, read from LAST_INSERT_ID (which
    the update sets to the holder's), and whether it was a duplicate from ``@sqlmq_dups``.
    One multi-row INSERT … RETURNING on MariaDB would be fewer round trips, but with four
    processes publishing the same keys it now and then returned no row for a key and left
    no row holding it either (``tests/test_dedup.py``, about one run in three); a row at a
    time has not (and is MySQL 8's way anyway: it has no RETURNING)."""
    statement = _insert(table, dialect, _shape(messages), True)
    held: dict[str, tuple[int, bool]] = {}
    for row in _keyed_rows(messages, first, fair):
        yield _RESET_DUPLICATES, None
        msg_id = (yield statement, row).lastrowid
        duplicates = _duplicates((yield _READ_DUPLICATES, None))
        held[row["dedup_key"]] = (msg_id, msg_id in duplicates)
    return held


def _duplicates(result: Any) -> set[int]:
    return {int(i) for i in (result.scalar() or "").split(",") if i}


#: ON DUPLICATE KEY UPDATE's value for ``id``: the same id, made LAST_INSERT_ID, having
#: appended it to ``@sqlmq_dups`` (an assignment in an expression: deprecated on MySQL 8,
#: still there). SQLAlchemy's MySQL drivers count found rows, so the affected-row count
#: cannot tell an insert from a duplicate.
_NOTE_DUPLICATE = ("LAST_INSERT_ID(id)"
                   " + 0 * LENGTH(@sqlmq_dups := CONCAT(@sqlmq_dups, ',', id))")
_RESET_DUPLICATES = text("SET @sqlmq_dups = ''")
_READ_DUPLICATES = text("SELECT @sqlmq_dups")


__all__ = ["CHUNK", "Flow", "expires_at_of", "pending_values", "publish_flow", "run_flow",
           "run_flow_sync"]
