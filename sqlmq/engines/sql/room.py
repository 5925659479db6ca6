"""A publish to a channel on the SQL engines, in SQLAlchemy Core (the model is
:mod:`sqlmq.channels`): the flow that makes sure the channel's row exists and locks it,
checks ``max_size`` (against the row's size bound, counting the channel's messages only
when they may not fit: :func:`_sized`), gives the messages their turns in the fair order,
and then inserts them (:func:`.publish.publish_flow`).

Its statements are built once per schema and database (:func:`room_statements`), with the
channel and the queue as parameters. Built on every publish, as they were, SQLAlchemy made
and keyed for its cache seven statements, and the aliases of the message table that the
ordered window's count reads, every time: a publish to an ordered channel took 6-8 ms, and
2.5-3.3 ms with them built once (``bench.publish_paths``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Integer, bindparam, func, literal, select, update
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Dialect

from ...channels import NO_LIMITS, ChannelSettings, Turns, check_size, first_turn, window_room
from ...records import NewMessages
from ...schema import Schema
from ...sqltime import db_now_plus
from .fair import window_of
from .publish import Flow, Step, publish_flow

_NOW = db_now_plus(literal(0.0))
#: How often a statement that makes a channel's row and then reads or updates it tries
#: again when the row was deleted between the two (forget_idle_channels): once is rare.
MAKE_TRIES = 3


def vanished(name: str) -> RuntimeError:
    """What a statement that made channel ``name``'s row and found it gone each time says."""
    return RuntimeError(f"channel {name!r}: its row vanished {MAKE_TRIES} times as it was "
                        "made")


_INSERT_IGNORE: dict[str, Callable[..., Any]] = {
    "postgresql": lambda t, v: pg_dialect.insert(t).values(**v).on_conflict_do_nothing(),
    "sqlite": lambda t, v: sqlite_dialect.insert(t).values(**v).on_conflict_do_nothing(),
    "mysql": lambda t, v: _mysql_insert_or_nothing(t, v),
    "mariadb": lambda t, v: _mysql_insert_or_nothing(t, v),
}


def _mysql_insert_or_nothing(table: Any, values: dict[str, Any]) -> Any:
    """An insert whose duplicate sets its key to itself: INSERT IGNORE would leave a
    warning on every publish to an existing channel, which the driver prints."""
    stmt = mysql_dialect.insert(table).values(**values)
    (key,) = table.primary_key.columns
    return stmt.on_duplicate_key_update({key.name: stmt.inserted[key.name]})


def _make_channel(dialect: str, channel: Any) -> Any:
    """Make channel row ``p_name`` (of queue ``p_queue``) unless it exists."""
    return _INSERT_IGNORE[dialect](channel, {"name": bindparam("p_name"),
                                             "queue": bindparam("p_queue"),
                                             "created_at": _NOW})


def default_columns(d: Any) -> list[Any]:
    """Queue default ``d``'s settings, labelled as :func:`effective` reads them."""
    return [d.c.max_concurrency.label("d_max_concurrency"), d.c.rate.label("d_rate"),
            d.c.ordered.label("d_ordered"), d.c.max_size.label("d_max_size")]


def effective(r: Any) -> ChannelSettings:
    """A channel row's settings (read with :func:`default_columns` of its queue's default
    outer-joined): its own if configured, else its queue's default, else none."""
    if r.configured:
        return ChannelSettings.from_row(r)
    if r.d_ordered is None:  # no default row
        return NO_LIMITS
    return ChannelSettings(r.d_max_concurrency,
                           None if r.d_rate is None else float(r.d_rate),
                           bool(r.d_ordered), r.d_max_size)


@dataclass(frozen=True)
class RoomStatements:
    """The statements of :func:`room_flow` for one schema and database; parameters
    ``p_name`` (the channel), ``p_queue`` (the publish's queue), ``p_turn`` and
    ``p_bound``."""

    make: Any
    #: Whether a publish makes the row before it reads it (below) rather than only when
    #: the read finds none, a statement more: on MySQL and MariaDB, whose locking read of
    #: a missing row takes a gap lock at REPEATABLE READ, so two publishers to a new
    #: channel would each wait for the other's insert.
    make_first: bool
    #: The row, locked (SQLite's write transaction holds it already), with its queue's
    #: clock read beside it, unlocked: a locking read does not lock what its subqueries
    #: read, on any of the three databases. On SQLite, whose write transaction locks
    #: everything, its queue's default too (:func:`effective` reads the row): three
    #: statements instead of four for a publish to a channel without settings of its own.
    found: Any
    #: Whether ``found`` has the queue's default (SQLite); elsewhere ``default`` reads it
    #: under a shared lock of its own, which a join would make the row lock's mode.
    joined_default: bool
    default: Any  # the queue's default, under a shared lock
    size: Any
    advance: Any  # the channel's last turn and size bound
    bound: Any  # the size bound alone (a channel with limits has no turns)
    window: Any


@functools.lru_cache(maxsize=64)
def room_statements(schema: Schema, dialect: str) -> RoomStatements:
    c, d, m, k = schema.channel, schema.channel_default, schema.message, schema.channel_clock
    name, queue = bindparam("p_name"), bindparam("p_queue")
    bound = bindparam("p_bound", type_=BigInteger())
    clock = select(k.c.turn).where(k.c.queue == queue).scalar_subquery()
    found = select(c.c.configured, c.c.max_concurrency, c.c.rate, c.c.ordered, c.c.max_size,
                   c.c.queue, c.c.last_turn, c.c.size_bound, clock.label("clock")
                   ).where(c.c.name == name)
    default = select(d).where(d.c.queue == queue)
    joined = dialect == "sqlite"
    if joined:
        found = found.add_columns(*default_columns(d)).select_from(
            c.outerjoin(d, d.c.queue == c.c.queue))
    else:
        found, default = found.with_for_update(), default.with_for_update(read=True)
    return RoomStatements(
        make=_make_channel(dialect, c), make_first=dialect in ("mysql", "mariadb"),
        found=found, joined_default=joined, default=default,
        size=select(func.count()).select_from(m).where(m.c.channel == name),
        advance=update(c).where(c.c.name == name).values(
            last_turn=bindparam("p_turn", type_=Integer()), size_bound=bound),
        bound=update(c).where(c.c.name == name).values(size_bound=bound),
        window=window_of(schema, name))


def channel_flow(schema: Schema, dialect: Dialect, messages: NewMessages,
                 wake: Step | None, free: Callable[[], None] = lambda: None) -> Flow:
    """Make room in the channel (:func:`room_flow`), publish with the turns it gave;
    ``free`` is told when they were given (a channel without limits)."""
    assert messages.channel is not None
    turns = yield from room_flow(schema, dialect, messages.channel, messages.queue,
                                 len(messages))
    if turns is not None:
        free()
    return (yield from publish_flow(schema.message, dialect, messages, wake, turns))


def room_flow(schema: Schema, dialect: Dialect, name: str, queue: str,
              adding: int, refuse: bool = True) -> Generator[Step, Any, Turns | None]:
    """Create channel ``name``'s row if need be and lock it (writers to one channel take
    turns, so its size bound and any count are exact), then refuse ``adding`` more
    messages with :class:`~sqlmq.errors.ChannelFull` if they would exceed its
    ``max_size`` (:func:`_sized`): a publish's and a requeue's check. Else, for a channel
    without limits, give them their turns (:func:`sqlmq.channels.first_turn`; None: a
    channel with limits, whose messages get no ``fair_key``). The queue's clock is read
    without a lock: a stale one only places a channel that had nothing waiting a little
    early in the round. The queue's default is read under a shared lock, so that a change
    of it waits for this publish and then sees its rows
    (:meth:`ChannelAdmin.set_channel_default`). ``refuse`` False: the messages enter
    whatever the ``max_size`` (a workflow's step released when its dependencies ended,
    which nothing could publish again later), counted in the size bound as any."""
    sql = room_statements(schema, dialect.name)
    params = {"p_name": name, "p_queue": queue}
    row = None if sql.make_first else (yield sql.found, params).one_or_none()
    tries = 0
    while row is None and tries < MAKE_TRIES:  # it may be forgotten between the two
        yield sql.make, params
        row = (yield sql.found, params).one_or_none()
        tries += 1
    if row is None:
        raise vanished(name)
    if sql.joined_default or row.configured:
        settings = effective(row)
    else:
        settings = yield from default_flow(schema, dialect, row.queue)
    if refuse:
        bound = yield from _sized(sql, params, row.size_bound, adding, settings.max_size)
    else:
        bound = (None if settings.max_size is None or row.size_bound is None
                 else row.size_bound + adding)
    if settings.limited:
        if bound != row.size_bound:
            yield sql.bound, {**params, "p_bound": bound}
        return None
    turn = first_turn(row.last_turn, row.clock)
    yield sql.advance, {**params, "p_turn": turn + adding - 1, "p_bound": bound}
    if not settings.ordered:
        return Turns(turn)
    # Under the row's lock, so publishes to the channel see each other's messages; a
    # take of its head committing meanwhile may miss these (see core_fair's HeadMending).
    window = (yield sql.window, params).one()
    return Turns(turn, ordered=True, room=window_room(window.waiting, bool(window.blocked)))


def _sized(sql: RoomStatements, params: dict[str, Any], bound: int | None, adding: int,
           max_size: int | None) -> Generator[Step, Any, int | None]:
    """Refuse ``adding`` more messages with :class:`~sqlmq.errors.ChannelFull` if they
    would take channel ``p_name`` over ``max_size``; its size bound after them (None
    without a ``max_size``: a bound not kept meanwhile would be too low once one is set).

    Every message enters a channel through :func:`room_flow` (a publish, a requeue), under
    the row's lock, and adds to the bound; leaving (archived, cancelled, deleted) does not
    touch it. So the bound is never below the channel's size, and is its size right after
    a count. Publishes that fit under it are let in without counting; one that does not
    counts the messages (as every publish under a ``max_size`` did: 20 ms with 50,000 of
    them on PostgreSQL and MariaDB) and is refused by that count alone."""
    if max_size is None:
        return None
    if bound is None or bound + adding > max_size:
        bound = int((yield sql.size, params).scalar_one())
        check_size(params["p_name"], bound, adding, max_size)
    return bound + adding


def default_flow(schema: Schema, dialect: Dialect,
                 queue: str) -> Generator[Step, Any, ChannelSettings]:
    """Queue ``queue``'s default for its channels, read under a shared lock."""
    row = (yield room_statements(schema, dialect.name).default, {"p_queue": queue}).first()
    return NO_LIMITS if row is None else ChannelSettings.from_row(row)


__all__ = ["MAKE_TRIES", "RoomStatements", "channel_flow", "default_columns", "default_flow",
           "effective", "room_flow", "room_statements", "vanished"]
