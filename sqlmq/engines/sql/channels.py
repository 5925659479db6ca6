"""Channels on the SQL engines, in SQLAlchemy Core (schema version 10; the model is
:mod:`sqlmq.channels`).

**Publish.** A channel's messages are written with ``channel_due_at`` (and no
``next_attempt_at``, so the plain acquire, which reads the ready index, never sees them) in
a flow that first makes sure the channel's row exists and locks it: publishes to one channel
take turns, so ``max_size`` is checked against an exact count, and a refused publish raises
:class:`~sqlmq.errors.ChannelFull` before writing anything (in the caller's transaction,
only that publish fails).

**Acquire.** Candidates are read first without locks: channels with a message due in the
subscriber's queues, not at their concurrency limit, not waiting for their rate, least
recently served first. Then their rows are locked (``SKIP LOCKED``: a channel another
process is serving is left to it; SQLite's writers take turns anyway), the running
deliveries counted again under the lock (exact: only a locked acquire adds to it), each
channel's allowance taken (an even share of the batch, within its limits; an ordered
channel's head only), the rows taken as the plain acquire takes them (with ``RETURNING``
where UPDATE has it), and the channels marked served (and their next start moved, under a
rate). Under READ COMMITTED and on SQLite the read and the serve are one transaction; a
caller's engine at REPEATABLE READ gets two, so that the recount sees past the read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Float,
    Integer,
    Text,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    true,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from ...channels import NO_LIMITS, ChannelInfo, ChannelSettings, allowance, next_start, share
from ...lifecycle import State
from ...records import Delivery
from ...schema import Schema, channel_index_of, limited_rows
from ...sqltime import db_now_plus
from ...views import ARCHIVED_STATES, MessageView
from ..sqlite import statements as sqlite_sql
from .fair import CHANNEL_LOOK_INTERVAL, FairAcquire, is_ordered, limited, rekey, with_default
from .insights import live_view
from .lists import list_rows, listed, served_in_order, with_list
from .operations import not_paused
from .publish import run_flow
from .room import MAKE_TRIES, default_columns, default_flow, effective, room_statements, vanished
from .rows import blob, decode_history, decode_rows, headers_of, undecodable_delivery
from .statements import names_for, render
from .waits import waits_of

_NOW = db_now_plus(literal(0.0))
log = logging.getLogger("sqlmq")
#: How many times a part of an acquire runs while the database chooses it as a deadlock's
#: victim (see ``ChannelStatements.acquire``).
ACQUIRE_TRIES = 3
_WAITING = (State.PENDING.value, State.RETRYABLE.value)


def _taken_deliveries(rows: Sequence[Any], picked: dict[int, tuple[str, datetime]],
                      holding: set[str], passing: set[str] | frozenset[str]) -> list[Delivery]:
    """The deliveries of the ``rows`` a channel take returned, in ``picked``'s order."""

    def decode(r: Any) -> Delivery:
        return Delivery(r.id, r.queue, headers_of(r.headers), blob(r.payload),
                        r.attempts_count, r.deliveries_count, r.created_at,
                        r.first_attempt_at, r.acquired_at, r.lease_expires_at,
                        picked[r.id][1], decode_history(r.history), priority=r.priority,
                        expires_at=r.expires_at, saved_state=r.saved_state,
                        defers=r.defers_count, cancel_requested=bool(r.cancel_requested),
                        channel=picked[r.id][0],
                        holds_slot=picked[r.id][0] in holding,
                        passes_slot=picked[r.id][0] in passing)

    def undecodable(r: Any, exc: BaseException) -> Delivery:
        return undecodable_delivery(r.id, r.queue, r.attempts_count, r.deliveries_count, exc)

    order = {msg_id: i for i, msg_id in enumerate(picked)}
    out = decode_rows(rows, decode, undecodable)
    out.sort(key=lambda d: order[d.id])
    return out


class ChannelStatements(FairAcquire):
    """The channel half of the engine contract for :class:`~.engine.SqlEngine`."""

    schema: Schema
    LOCK_FOR_REQUEUE: bool
    _channels_first: bool = True
    #: See :meth:`_reads_fresh_under_locks` (None: not read yet).
    _fresh_reads: bool | None = None
    #: Per list of queues: when (monotonic) its soonest rate-limited channel may start
    #: again, as the last acquire that started none saw it (:func:`_next_try`).
    _rate_waits: dict[tuple[str, ...], float | None]
    #: The engine's transaction runner (settle_onward's, PostgreSQL's retrying one).
    _transaction: Callable[[Callable[[AsyncConnection], Awaitable[Any]]], Awaitable[Any]]

    async def _acquire_plain(self, queues: Sequence[str], limit: int,
                             lease: float) -> list[Delivery]:
        raise NotImplementedError

    if TYPE_CHECKING:
        def deadlock_victim(self, exc: BaseException) -> bool: ...

    async def acquire(self, queues: Sequence[str], limit: int, lease: float) -> list[Delivery]:
        """The plain acquire, and, once channels exist, the channels' acquire: each goes
        first every other time, the second taking what the first left of ``limit``.

        Each is its own transaction. One the database chose as a deadlock's victim wrote
        nothing, and runs again at once (:func:`again_if_victim`): the fetcher's backoff
        made a drain wait, with a warning, for what is routine on a busy MariaDB. If the
        second fails otherwise, the first's messages are returned all the same, leased to
        this caller (raised, they waited out their lease unrun), and the failure logged:
        the next acquire meets it again if it lasts."""
        victim = self.deadlock_victim
        if not await self._lookouts.channels.sees(self._transaction):
            return await again_if_victim(self._acquire_plain, victim, queues, limit, lease)
        self._channels_first = not self._channels_first
        parts = (self._acquire_channels, self._acquire_plain)
        first, second = parts if self._channels_first else parts[::-1]
        out = await again_if_victim(first, victim, queues, limit, lease)
        if len(out) < limit:
            try:
                out += await again_if_victim(second, victim, queues, limit - len(out), lease)
            except Exception as exc:
                if not out:
                    raise
                log.warning("an acquire from %s took %d message(s), then failed (%s: %s); "
                            "they run, and the next acquire tries again", ",".join(queues),
                            len(out), type(exc).__name__, exc, exc_info=True)
        return out

    def channel_start_in(self, queues: Sequence[str]) -> float | None:
        at = self._rate_waits.get(tuple(queues))
        return None if at is None else max(0.0, at - time.monotonic())

    async def _acquire_channels(self, queues: Sequence[str], limit: int,
                                lease: float) -> list[Delivery]:
        """The channels with limits (:meth:`_acquire_limited`), then the others in fair
        order (:meth:`_acquire_fair`) with what they left of ``limit``; if those were
        fewer, a mending of ordered channels' heads, in the background (at most once a
        :data:`.fair.CHANNEL_LOOK_INTERVAL`)."""
        lookouts = self._lookouts
        out = (await self._acquire_limited(queues, limit, lease)
               if await lookouts.limits.sees(self._transaction) else [])
        if len(out) < limit and await lookouts.free.sees(self._transaction):
            fair = await self._acquire_fair(queues, limit - len(out), lease)
            if (len(fair) < limit - len(out)
                    and await lookouts.ordered.sees(self._transaction)):
                self._mending.due(self._transaction)
            out += fair
        return out

    async def _acquire_limited(self, queues: Sequence[str], limit: int,
                               lease: float) -> list[Delivery]:
        """The channels with limits, least recently served first, each an even share of
        ``limit`` (counting the channels the last fair acquire served, so the two kinds
        share alike), under their row locks."""
        sql, params = self._channel_sql, {"queues": list(queues), "most_channels": limit + 8}

        async def read(conn: AsyncConnection) -> tuple[Sequence[Any], float | None]:
            rows = (await conn.execute(sql.candidates, params)).all()
            if rows:
                return rows, None
            soonest = (await conn.execute(sql.soonest_start, params)).one()
            if soonest.at is None:
                return rows, None
            return rows, time.monotonic() + (soonest.at - soonest.now).total_seconds()

        serve = partial(self._serve, queues=queues, limit=limit, lease=lease,
                        others=self._fair_spread.get(tuple(queues), 0))
        if await self._reads_fresh_under_locks():
            async def both(conn: AsyncConnection) -> tuple[Any, float | None, list[Delivery]]:
                found, wait = await read(conn)
                return found, wait, (await serve(conn, candidates=found) if found else [])

            candidates, wait, out = await self._transaction(both)
        else:  # apart from the serve: inside it, under REPEATABLE READ (a caller's own
            # engine), the recount would read the snapshot this read took before the locks
            candidates, wait = await self._transaction(read)
            out = (await self._transaction(partial(serve, candidates=candidates))
                   if candidates else [])
        self._rate_waits[tuple(queues)] = _next_try(out, candidates) if candidates else wait
        return out

    async def _reads_fresh_under_locks(self) -> bool:
        """Whether a statement after the channel locks sees what other transactions
        committed before them, so the candidates may be read in the serve's transaction:
        READ COMMITTED (every statement its own snapshot), and SQLite (one writer at a
        time, from its BEGIN IMMEDIATE on). The connections' level is read once."""
        if self._fresh_reads is None:
            if self.db.dialect.name == "sqlite":
                self._fresh_reads = True
            else:
                async with self.db.connect() as conn:
                    level = await conn.get_isolation_level()
                self._fresh_reads = level == "READ COMMITTED"
        return self._fresh_reads

    async def _serve(self, conn: AsyncConnection, queues: Sequence[str], limit: int,
                     lease: float, candidates: Sequence[Any],
                     others: int) -> list[Delivery]:
        sql, names = self._channel_sql, [r.name for r in candidates]
        now: datetime = candidates[0].now
        # read again under the lock: another process may have started one since
        starts = {name: at for name, at in await conn.execute(sql.lock, {"names": names})
                  if at is None or at <= now}
        chosen = [r for r in candidates if r.name in starts]
        if not chosen:
            return []
        running = dict((await conn.execute(
            sql.running, {"names": [r.name for r in chosen]})).all())
        even = share(limit, len(chosen) + others)
        plan: dict[str, tuple[int, ChannelSettings, Any]] = {}
        left = limit
        for r in chosen:
            settings = effective(r)
            n = min(allowance(settings, running.get(r.name, 0), even), left)
            if n > 0:
                plan[r.name] = (n, settings, starts[r.name])
                left -= n
            if not left:
                break
        if not plan:
            return []
        picked = await self._pick(conn, queues, plan, now)
        if not picked:
            return []
        out = await self._take(conn, picked, lease,
                               {name for name, (_, s, _) in plan.items() if s.holds_slots},
                               {name for name, (_, s, _) in plan.items() if s.passes_slots})
        # A rate spaces the starts as stamped on the deliveries (the take's clock), not from
        # the read before the locks: from the read, a slow take let the next start come
        # less than an interval after this one's acquired_at.
        started = out[0].acquired_at if out else now
        await self._served(conn, {channel for channel, _ in picked.values()}, plan, started)
        return out

    async def _pick(self, conn: AsyncConnection, queues: Sequence[str],
                    plan: dict[str, tuple[int, ChannelSettings, Any]],
                    now: datetime) -> dict[int, tuple[str, datetime]]:
        """The ids to take (with their channel and due time): each ordered channel's head
        if it is due and in ``queues``, then each unordered channel's due messages in
        acquire order (priority, due time, id), round by round in serving order (the
        first of every channel, then the second, ...), so the workers take turns too.
        Messages of paused queues are left out here, in the transaction that takes them,
        so that a pause is exact across processes."""
        ordered = [name for name, (_, s, _) in plan.items() if s.ordered]
        picks: dict[int, tuple[str, datetime]] = {}
        if ordered:
            statement, params = self._channel_sql.heads_of(ordered)
            for row in await conn.execute(statement, params):
                if (row.state in _WAITING and row.queue in queues
                        and row.channel_due_at is not None and row.channel_due_at <= now):
                    picks[row.id] = (row.channel, row.channel_due_at)
        position = {name: i for i, name in enumerate(plan)}
        unordered = {name: n for name, (n, settings, _) in plan.items() if not settings.ordered}
        if unordered:
            found = await self._due_rows(conn, sorted(unordered), queues,
                                         max(unordered.values()))
            # the first of every channel, then the second of every channel, ...
            for r in sorted(found, key=lambda r: (r.rn, position[r.channel])):
                if r.rn <= unordered[r.channel]:
                    picks[r.id] = (r.channel, r.channel_due_at)
        return picks

    async def _due_rows(self, conn: AsyncConnection, names: list[str],
                        queues: Sequence[str], most: int) -> Sequence[Any]:
        """Each of the channels ``names``' first ``most`` due messages in ``queues``, in
        acquire order: ``id``, ``channel``, ``channel_due_at``, ``rn`` (from 1 each)."""
        statement, params = self._channel_sql.due_of(names)
        return (await conn.execute(statement, {**params, "queues": list(queues),
                                               "most": most})).all()

    async def _take(self, conn: AsyncConnection, picked: dict[int, tuple[str, datetime]],
                    lease: float, holding: set[str],
                    passing: set[str] | frozenset[str] = frozenset()) -> list[Delivery]:
        """Acquire ``picked``; the deliveries of the ``holding`` channels hold a slot, those
        of the ``passing`` channels may pass it on (``Delivery.passes_slot``)."""
        return self._taken(await self._take_rows(conn, picked, lease), picked, holding,
                           passing)

    async def _take_rows(self, conn: AsyncConnection, picked: dict[int, tuple[str, datetime]],
                         lease: float) -> Sequence[Any]:
        """Acquire ``picked``: the rows taken, as :meth:`_taken` decodes them (which a
        caller may do after its commit)."""
        sql, ids = self._channel_sql, sorted(picked)
        params = {"ids": ids, "lease": float(lease)}
        if sql.take_returning is not None:
            return (await conn.execute(sql.take_returning, params)).all()
        # Without RETURNING, the rows are locked first: read back after the UPDATE, a
        # row another transaction took meanwhile (and this one's UPDATE skipped) would
        # look taken by this one too, and run twice.
        ids = sorted((await conn.execute(sql.lock_waiting, {"ids": ids})).scalars())
        if not ids:
            return []
        params["ids"] = ids
        await conn.execute(sql.take, params)
        return (await conn.execute(sql.taken, {"ids": ids})).all()

    #: The deliveries of the rows :meth:`_take_rows` took (SQLite decodes its own).
    _taken = staticmethod(_taken_deliveries)

    async def _served(self, conn: AsyncConnection, channels: set[str],
                      plan: dict[str, tuple[int, ChannelSettings, Any]],
                      now: datetime) -> None:
        """Mark ``channels`` served now (to the back of the fair-sharing order); under a
        rate, move their next start."""
        sql = self._channel_sql
        order = [n for n in plan if n in channels]
        if order:  # their place in the serving order breaks the tie of a shared served_at
            await conn.execute(sql.served, {"names": order})
        for name in sorted(n for n in order if plan[n][1].rate is not None):
            _, settings, planned = plan[name]
            await conn.execute(sql.next_start, {
                "channel": name, "at": next_start(settings, planned, now)})

    @cached_property
    def _channel_sql(self) -> ChannelSql:
        return ChannelSql(self.schema, self.db.dialect, self.LOCK_FOR_REQUEUE)


class ChannelAdmin:
    """Channel settings and listings for :class:`~.engine.SqlEngine` (the admin's calls, none
    on the hot path)."""

    schema: Schema
    LOCK_FOR_REQUEUE: bool
    _transaction: Callable[[Callable[[AsyncConnection], Awaitable[Any]]], Awaitable[Any]]
    _saw_channels: Callable[[], None]
    _saw_limits: Callable[[], None]
    _saw_free_channel: Callable[[], None]
    _read: Callable[[Any], Awaitable[list[Any]]]

    async def set_channel(self, name: str, queue: str | None,
                          settings: ChannelSettings | None) -> bool:
        """Set (or, with None, reset) channel ``name``'s settings, and keep its messages'
        place in the fair order true to the settings that now apply (:func:`.fair.rekey`), in
        the transaction that changes them: its row's lock keeps publishes out meanwhile."""
        c = self.schema.channel
        values = {"configured": int(settings is not None), **(settings or NO_LIMITS).as_row()}

        async def write(conn: AsyncConnection) -> int:
            found = 0
            for _ in range(MAKE_TRIES):  # the row may be forgotten between the two
                if settings is not None:  # made if need be (a reset makes nothing)
                    await conn.execute(room_statements(self.schema, conn.dialect.name).make,
                                       {"p_name": name, "p_queue": queue or ""})
                found = (await conn.execute(update(c).where(c.c.name == name)
                                            .values(**values))).rowcount
                if found or settings is None:
                    break
            else:  # made and forgotten each time: as room_flow, never a silent no
                raise vanished(name)
            if found:
                effective = settings or await run_flow(conn, default_flow(
                    self.schema, conn.dialect, (await conn.execute(
                        select(c.c.queue).where(c.c.name == name))).scalar_one()))
                await rekey(conn, self.schema, [name], effective)
            return found

        if found := await self._transaction(write):
            self._saw_channels()
            if settings is not None and settings.limited:
                self._saw_limits()
            else:
                self._saw_free_channel()
        return bool(found)

    async def forget_idle_channels(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` channel rows nothing needs any more (see the contract).
        The rows are locked first (those a publish holds are skipped) and the table is read
        again after the locks, by the DELETE: a publish that held one has committed its
        message by then, and one that comes after finds the row gone and makes it again
        (:func:`room_flow`)."""
        c, m = self.schema.channel, self.schema.message
        unused = ~exists().where(m.c.channel == c.c.name)

        async def sweep(conn: AsyncConnection) -> int:
            idle = (select(c.c.name)
                    .where(c.c.configured == 0, c.c.created_at < before,
                           or_(c.c.served_at.is_(None), c.c.served_at < before),
                           or_(c.c.next_start_at.is_(None), c.c.next_start_at <= _NOW),
                           unused)
                    .order_by(c.c.name).limit(limit))
            if conn.dialect.name != "sqlite":  # SQLite's write transaction holds them all
                idle = idle.with_for_update(skip_locked=True)
            names = list((await conn.execute(idle)).scalars())
            if not names:
                return 0
            result = await conn.execute(delete(c).where(c.c.name.in_(names), unused))
            return int(result.rowcount)

        return int(await self._transaction(sweep))

    async def set_channel_default(self, queue: str, settings: ChannelSettings | None) -> None:
        """Set (or remove) ``queue``'s default, and keep the fair order true to it for the
        queue's channels without settings of their own (:func:`.fair.rekey`). Their rows are
        locked first, and the old default row is deleted (a publish reads it under a
        shared lock): a publish that read the old default has committed, and its rows are
        seen, before the new one is applied."""
        c, d = self.schema.channel, self.schema.channel_default

        async def write(conn: AsyncConnection) -> None:
            theirs = select(c.c.name).where(c.c.queue == queue, c.c.configured == 0)
            locked = theirs.order_by(c.c.name)
            if self.LOCK_FOR_REQUEUE:
                locked = locked.with_for_update()
            names = list((await conn.execute(locked)).scalars())
            await conn.execute(delete(d).where(d.c.queue == queue))
            if settings is not None:
                await conn.execute(insert(d).values(queue=queue, **settings.as_row()))
            if names:
                await rekey(conn, self.schema, names, settings or NO_LIMITS)

        await self._transaction(write)
        if settings is not None and settings.limited:
            self._saw_limits()
        else:
            self._saw_free_channel()

    async def channel_defaults(self) -> dict[str, ChannelSettings]:
        d = self.schema.channel_default

        async def read(conn: AsyncConnection) -> Sequence[Any]:
            return (await conn.execute(select(d).order_by(d.c.queue))).all()

        rows = await self._transaction(read)
        return {r.queue: ChannelSettings.from_row(r) for r in rows}

    async def channels(self) -> list[ChannelInfo]:
        c, d, m = self.schema.channel, self.schema.channel_default, self.schema.message

        async def read(conn: AsyncConnection) -> tuple[Sequence[Any], Sequence[Any]]:
            rows = (await conn.execute(select(c, *default_columns(d)).select_from(
                with_default(self.schema)).order_by(c.c.name))).all()
            due = func.coalesce(m.c.next_attempt_at, m.c.channel_due_at)
            counts = (await conn.execute(
                select(m.c.channel, m.c.state, func.count(), func.min(due))
                .where(m.c.channel.is_not(None)).group_by(m.c.channel, m.c.state))).all()
            return rows, counts

        rows, counts = await self._transaction(read)
        waiting: dict[str, int] = {}
        running: dict[str, int] = {}
        oldest: dict[str, Any] = {}
        for name, state, n, first in counts:
            into = running if state == State.PROCESSING else waiting
            into[name] = into.get(name, 0) + n
            if state != State.PROCESSING and first is not None and (
                    oldest.get(name) is None or first < oldest[name]):
                oldest[name] = first
        return [ChannelInfo(r.name, r.queue,
                            ChannelSettings.from_row(r) if r.configured else None,
                            effective(r), waiting.get(r.name, 0), running.get(r.name, 0),
                            r.served_at, oldest.get(r.name)) for r in rows]

    async def channel_served(self, window: float) -> dict[str, int]:
        a = self.schema.archive
        # The final states named, so that the (state, archived_at) index reads the window.
        stmt = (select(a.c.channel, func.count())
                .where(a.c.archived_at >= db_now_plus(literal(-float(window))),
                       a.c.state.in_(ARCHIVED_STATES), a.c.channel.is_not(None))
                .group_by(a.c.channel))
        return {name: int(n) for name, n in await self._read(stmt)}

    async def channel_messages(self, channel: str, limit: int) -> list[MessageView]:
        m = self.schema.message
        stmt = (select(m, waits_of(m).label("waits")).where(m.c.channel == channel)
                .order_by(m.c.id).limit(limit))
        return [live_view(r) for r in await self._read(stmt)]


class ChannelSql:
    """The statements of the channels' acquire, built once per engine. Built at every
    acquire (and their cache keys computed from scratch), they cost about a third of its
    Python time: py-spy of the limited drain put the acquire at 35 % of the process's CPU,
    a third of it in building ``_candidates`` and the lists' expressions. Parameters: the
    subscriber's ``queues`` (an expanding list), ``names``/``ids``/``ordered`` (one list
    parameter each, :mod:`.lists`; the pick's ``names`` expand), ``most_channels``,
    ``most``, ``lease``, ``channel``, ``at``."""

    def __init__(self, schema: Schema, dialect: Dialect, lock_rows: bool) -> None:
        c, m = schema.channel, schema.message
        self.candidates = _candidates(schema, dialect)
        self.soonest_start = _soonest_start(schema, dialect)
        self.lock = select(c.c.name, c.c.next_start_at).where(
            listed(dialect, c.c.name, "names"))
        if lock_rows:  # not SQLite, where writers take turns
            self.lock = self.lock.with_for_update(skip_locked=True)
        self.running = _running_counts(schema, dialect)
        self.heads = _heads(schema, dialect)
        # (SQLite reads by its own statement, sql/sqlite.py's DUE_PER_CHANNEL.)
        self.due_per_channel = (_due_per_channel_in_order(schema, dialect)
                                if dialect.name == "postgresql"
                                else _due_per_channel(schema))
        self._schema = schema
        #: MySQL and MariaDB read per channel by UNION ALL, a statement per number of
        #: channels, built once: :func:`_heads_unions`, :func:`_due_per_channel_unions`.
        self._by_unions = dialect.name in ("mysql", "mariadb")
        self._head_unions: dict[int, Any] = {}
        self._due_unions: dict[int, Any] = {}
        self.take = update(m).where(
            listed(dialect, m.c.id, "ids", "id"), m.c.state.in_(_WAITING),
            m.c.channel_due_at.is_not(None),
        ).values(
            state=State.PROCESSING.value, deliveries_count=m.c.deliveries_count + 1,
            acquired_at=_NOW, first_attempt_at=func.coalesce(m.c.first_attempt_at, _NOW),
            channel_due_at=None,
            lease_expires_at=db_now_plus(bindparam("lease", type_=Float())))
        delivered = (
            m.c.id, m.c.queue, type_coerce(m.c.headers, Text()).label("headers"), m.c.payload,
            m.c.attempts_count, m.c.deliveries_count, m.c.created_at, m.c.first_attempt_at,
            m.c.acquired_at, m.c.lease_expires_at, type_coerce(m.c.history, Text()).label(
                "history"), m.c.priority, m.c.expires_at, m.c.saved_state, m.c.defers_count,
            m.c.cancel_requested)
        self.taken = select(*delivered).where(
            listed(dialect, m.c.id, "ids", "id"), m.c.state == State.PROCESSING.value,
            m.c.channel_due_at.is_(None))
        #: The take and its read in one round trip where UPDATE has RETURNING (not MariaDB).
        self.take_returning = (self.take.returning(*delivered) if dialect.update_returning
                               else None)
        #: Elsewhere, the ids still waiting locked first (see ``_take``).
        self.lock_waiting = select(m.c.id).where(
            listed(dialect, m.c.id, "ids", "id"), m.c.state.in_(_WAITING),
            m.c.channel_due_at.is_not(None)).with_for_update(skip_locked=True)
        self.served = served_in_order(dialect, c, "names")
        self.slot_limits = _slot_limits(schema, dialect)
        self.next_start = update(c).where(c.c.name == bindparam("channel")).values(
            next_start_at=bindparam("at", type_=c.c.next_start_at.type))

    def heads_of(self, names: list[str]) -> tuple[Any, dict[str, Any]]:
        """The statement reading the heads of the ordered channels ``names``, and its
        parameters."""
        return (self._unions_for(self._head_unions, _heads_unions, names, "o")
                or (self.heads, {"ordered": names}))

    def due_of(self, names: list[str]) -> tuple[Any, dict[str, Any]]:
        """The statement reading the due messages of the channels ``names`` for the pick,
        and its parameters besides ``queues`` and ``most``."""
        return (self._unions_for(self._due_unions, _due_per_channel_unions, names, "n")
                or (self.due_per_channel, {"names": names}))

    def _unions_for(self, built: dict[int, Any], build: Callable[[Schema, int], Any],
                    names: list[str], key: str) -> tuple[Any, dict[str, Any]] | None:
        """The UNION ALL statement for ``names`` (one name parameter each, ``key`` and its
        place), kept in ``built`` by count; None where the dialect does not read so or the
        names are too many."""
        if not self._by_unions or len(names) > MOST_UNIONS:
            return None
        statement = built.get(len(names))
        if statement is None:
            statement = built[len(names)] = build(self._schema, len(names))
        return statement, {f"{key}{i}": name for i, name in enumerate(names)}


async def again_if_victim(part: Callable[[Sequence[str], int, float], Awaitable[list[Delivery]]],
                          deadlock: Callable[[BaseException], bool], queues: Sequence[str],
                          limit: int, lease: float) -> list[Delivery]:
    """``part(queues, limit, lease)``, a part of an acquire, run again (up to
    :data:`ACQUIRE_TRIES` times in all) while the database chooses it as a deadlock's
    victim (``deadlock``)."""
    for tries in range(1, ACQUIRE_TRIES + 1):
        try:
            return await part(queues, limit, lease)
        except Exception as exc:
            if tries >= ACQUIRE_TRIES or not deadlock(exc):
                raise
            log.info("an acquire from %s was a deadlock's victim; running it again "
                     "(%d of %d)", ",".join(queues), tries + 1, ACQUIRE_TRIES)
    raise AssertionError("unreachable")


#: The most channels MySQL's and MariaDB's pick reads as a UNION ALL of one LIMIT each (a
#: statement built and kept per number of channels); beyond, the window over all their
#: due messages (and ``min(id)`` over all their messages for the heads).
MOST_UNIONS = 64


def _due_per_channel_unions(schema: Schema, channels: int) -> Any:
    """:func:`_due_per_channel` on MySQL and MariaDB, which have no LATERAL (MariaDB) and
    no LIMIT in an IN subquery: a UNION ALL of each channel's due messages in acquire
    order, cut at ``most``, read from the index ``(channel, priority DESC,
    channel_due_at, id)`` (schema version 15), then numbered. The window read every due
    message of the channels: 3 ms an acquire on average through a drain of 8 channels of
    1,000, growing with the backlog."""
    m = schema.message
    parts = [select(m.c.id, m.c.channel, m.c.channel_due_at, m.c.priority)
             .where(m.c.channel == bindparam(f"n{i}", type_=m.c.channel.type),
                    m.c.state.in_(_WAITING),
                    m.c.queue.in_(bindparam("queues", expanding=True)),
                    not_paused(schema, m.c.queue), m.c.channel_due_at <= _NOW)
             .order_by(m.c.priority.desc(), m.c.channel_due_at, m.c.id)
             .limit(bindparam("most", type_=Integer()))
             for i in range(channels)]
    rows = _union_of(parts)
    return select(rows.c.id, rows.c.channel, rows.c.channel_due_at, func.row_number().over(
        partition_by=rows.c.channel,
        order_by=(rows.c.priority.desc(), rows.c.channel_due_at, rows.c.id)).label("rn"))


def _first_of(m: Any, channel: Any, by_key: bool = True) -> Any:
    """A limited channel's first message in id order: ``(channel, fair_key, id)`` read at
    ``fair_key IS NULL``, where a limited channel's messages all are (a publish gives them
    no key, and making a channel limited takes its messages' keys away, both under the
    channel's row lock); the first index entry, whatever the backlog. ``by_key``: ordered
    by the index's columns, not by id alone: PostgreSQL otherwise walked the primary key
    from the lowest id, filtering, through every message of the channels before (38 ms);
    MariaDB, the other way round, sorts unless the order is by id."""
    return (select(m.c.id, m.c.channel, m.c.state, m.c.queue, m.c.channel_due_at)
            .where(m.c.channel == channel, m.c.fair_key.is_(None))
            .order_by(*((m.c.fair_key, m.c.id) if by_key else (m.c.id,))).limit(1))


def _heads(schema: Schema, dialect: Dialect) -> Any:
    """The first message (any state) of each ordered channel with limits listed as
    ``ordered``, unless its queue is paused: a LATERAL per name on PostgreSQL, a
    correlated subquery per name on SQLite. ``min(id) … GROUP BY channel`` read every
    message of the channels: 20 ms an acquire for 8 channels of 10,000 on PostgreSQL."""
    names = list_rows(dialect, "ordered")
    if dialect.name == "postgresql":
        head: Any = _first_of(schema.message.alias("f"), names.c.v).lateral("h")
        source = names.join(head, true())
    elif dialect.name == "sqlite":
        head, f = schema.message, schema.message.alias("f")
        source = names.join(head, head.c.id.in_(
            _first_of(f, names.c.v).with_only_columns(f.c.id).correlate(names)))
    else:
        head = schema.message
        first = (select(func.min(head.c.id))
                 .where(listed(dialect, head.c.channel, "ordered"))
                 .group_by(head.c.channel).scalar_subquery())
        return select(head.c.id, head.c.channel, head.c.state, head.c.queue,
                      head.c.channel_due_at).where(head.c.id.in_(first),
                                                   not_paused(schema, head.c.queue))
    return select(head.c.id, head.c.channel, head.c.state, head.c.queue,
                  head.c.channel_due_at).select_from(source).where(
        not_paused(schema, head.c.queue))


def _heads_unions(schema: Schema, channels: int) -> Any:
    """:func:`_heads` on MySQL and MariaDB: a UNION ALL of one ``LIMIT 1`` per channel,
    kept off the primary key, which MariaDB took for some channels' ``ORDER BY id
    LIMIT 1`` and walked through 40,000 rows of the channels before."""
    m = schema.message
    parts = [_first_of(m, bindparam(f"o{i}", type_=m.c.channel.type), by_key=False)
             .with_hint(m, "IGNORE INDEX FOR ORDER BY (PRIMARY)") for i in range(channels)]
    rows = _union_of(parts)
    return select(rows).where(not_paused(schema, rows.c.queue))


def _union_of(parts: list[Any]) -> Any:
    """``parts`` as one subquery: their UNION ALL, or the one part alone."""
    return (parts[0] if len(parts) == 1 else union_all(*parts)).subquery()


def _due_per_channel(schema: Schema) -> Any:
    """Each named channel's due messages in the ``queues`` numbered in acquire order
    (priority, due time, id), up to ``most`` each: one statement whatever the number of
    channels (a UNION ALL of a LIMIT per channel cost more to build and plan than to run,
    and ran at 3 % of the plain drain's speed with 1,000 channels)."""
    m = schema.message
    numbered = select(
        m.c.id, m.c.channel, m.c.channel_due_at,
        func.row_number().over(
            partition_by=m.c.channel,
            order_by=(m.c.priority.desc(), m.c.channel_due_at, m.c.id)).label("rn"),
    ).where(m.c.channel.in_(bindparam("names", expanding=True)),
            m.c.state.in_(_WAITING), m.c.queue.in_(bindparam("queues", expanding=True)),
            not_paused(schema, m.c.queue), m.c.channel_due_at <= _NOW).subquery()
    return select(numbered).where(numbered.c.rn <= bindparam("most"))


def _due_per_channel_in_order(schema: Schema, dialect: Dialect) -> Any:
    """:func:`_due_per_channel` on PostgreSQL: each named channel's due messages read in
    acquire order from the index ``(channel, priority DESC, channel_due_at, id)`` and cut at
    ``most`` (a LATERAL per name), then numbered. The window over every due message of the
    channels read 8,000 rows for 8 channels of 1,000, 5-9 ms of each acquire. ``fair_key
    IS NULL`` (true of every limited channel's message) is the index's own condition
    (schema version 17), which the planner must see to read it."""
    m, names = schema.message.alias("f"), list_rows(dialect, "names")
    first = (select(m.c.id, m.c.channel, m.c.channel_due_at, m.c.priority)
             .where(m.c.channel == names.c.v, m.c.state.in_(_WAITING),
                    m.c.queue.in_(bindparam("queues", expanding=True)),
                    not_paused(schema, m.c.queue), m.c.channel_due_at <= _NOW,
                    m.c.fair_key.is_(None))
             .order_by(m.c.priority.desc(), m.c.channel_due_at, m.c.id)
             .limit(bindparam("most", type_=Integer())))
    rows = first.lateral("r")
    return select(rows.c.id, rows.c.channel, rows.c.channel_due_at, func.row_number().over(
        partition_by=rows.c.channel,
        order_by=(rows.c.priority.desc(), rows.c.channel_due_at, rows.c.id)).label("rn")
    ).select_from(names.join(rows, true()))


def _due_in(schema: Schema, dialect: Dialect) -> Any:
    """A channel row has a message due in the ``queues`` (not paused).

    On MariaDB as a scalar subquery cut at one row, which it cannot turn into a semi-join:
    the EXISTS became one that read every due message of the queues into a table of
    distinct channels (8,000 rows, 7 ms, for 8 channels of 1,000; a LIMIT inside the
    EXISTS is dropped) where a probe of each channel's index takes one row."""
    m, c = schema.message, schema.channel
    due = select(m.c.id).where(
        m.c.channel == c.c.name, m.c.state.in_(_WAITING),
        m.c.queue.in_(bindparam("queues", expanding=True)),
        not_paused(schema, m.c.queue), m.c.channel_due_at <= _NOW)
    if dialect.name in ("mysql", "mariadb"):
        return due.limit(1).scalar_subquery().is_not(None)
    return due.exists()


def _next_try(out: Sequence[Delivery], candidates: Sequence[Any]) -> float | None:
    """When (monotonic) to look again for the rate-limited ``candidates`` of a serve that
    started nothing (``out`` empty): another process held their rows, or started one just
    before, so the soonest may start one interval of its rate after now. Without it the
    loser fell back on the fetcher's idle backoff, which doubles while acquires find
    nothing, and never met the channel's starts again: three processes on a channel at
    20/s, one of them made all 201 starts (the rate test, in CI). None: something started,
    or no candidate has a rate."""
    if out:
        return None
    rates = [r for r in (effective(c).rate for c in candidates) if r]
    return time.monotonic() + 1 / max(rates) if rates else None


def _running_counts(schema: Schema, dialect: Dialect) -> Any:
    """How many messages of each (limited) channel listed as ``names`` run, a row per
    channel that has any: the ``(channel, state)`` prefix of ``channel_index``. SQLite's
    is its own statement, which names the index (``RUNNING``)."""
    m = schema.message
    if dialect.name == "sqlite":
        return with_list(render(sqlite_sql.RUNNING, names_for(schema)), "names")
    return select(m.c.channel, func.count()).where(
        listed(dialect, m.c.channel, "names"),
        *limited_rows(channel_index_of(schema), dialect.name, m),
        m.c.state == State.PROCESSING.value).group_by(m.c.channel)


def _running(schema: Schema, dialect: Dialect) -> Any:
    """How many messages of the channel row's (limited) channel run: the ``(channel,
    state)`` prefix of ``channel_index``. MariaDB chose the index ``(channel, fair_key,
    id)`` instead and read every message of the channel (2.3 ms for 3 channels of 2,000,
    0.3 ms forced); SQLite, with its condition ``fair_key IS NULL``, read the index by both
    its columns: its count is its own (``running_of``), which names the index."""
    c, m = schema.channel, schema.message
    if dialect.name == "sqlite":
        return literal_column(render(sqlite_sql.running_of("{channel}"), names_for(schema)),
                              Integer)
    count = select(func.count()).where(
        m.c.channel == c.c.name, *limited_rows(channel_index_of(schema), dialect.name, m),
        m.c.state == State.PROCESSING.value)
    if dialect.name in ("mysql", "mariadb"):
        count = count.with_hint(m, f"FORCE INDEX ({channel_index_of(schema).name})")
    return count.scalar_subquery()


def _slot_limits(schema: Schema, dialect: Dialect) -> Any:
    """The settings of the channels listed as ``names`` (their own and their queue's
    default, as :func:`effective` reads them) and how many of their messages run."""
    c, d = schema.channel, schema.channel_default
    return (select(c.c.name, c.c.configured, c.c.max_concurrency, c.c.rate, c.c.ordered,
                   c.c.max_size, *default_columns(d),
                   _running(schema, dialect).label("running"))
            .select_from(with_default(schema))
            .where(listed(dialect, c.c.name, "names")))


def _soonest_start(schema: Schema, dialect: Dialect) -> Any:
    """When the soonest channel that waits only for its rate (a message of its is due in
    the ``queues``) may start again (``at``; NULL: none), and the database's now."""
    c = schema.channel
    return select(func.min(c.c.next_start_at).label("at"), _NOW.label("now")).where(
        c.c.next_start_at > _NOW, _due_in(schema, dialect))


def _candidates(schema: Schema, dialect: Dialect) -> Any:
    """Channels worth locking for an acquire from the ``queues``, least recently served
    first, up to ``most_channels``: a message of theirs is due in one of the queues, and
    they are neither at their concurrency limit (ordered: one running) nor waiting for
    their rate. Read without locks; :meth:`ChannelStatements._serve` checks again under
    them."""
    c, d = schema.channel, schema.channel_default
    running = _running(schema, dialect)
    due = _due_in(schema, dialect)
    own = c.c.configured == 1
    max_concurrency = case((own, c.c.max_concurrency), else_=d.c.max_concurrency)
    return (select(c.c.name, c.c.configured, c.c.max_concurrency, c.c.rate, c.c.ordered,
                   c.c.max_size, c.c.next_start_at, *default_columns(d),
                   _NOW.label("now"))
            .select_from(with_default(schema))
            .where(limited(c, d), due,
                   or_(max_concurrency.is_(None), running < max_concurrency),
                   or_(~is_ordered(c, d), running == 0),
                   or_(c.c.next_start_at.is_(None), c.c.next_start_at <= _NOW))
            .order_by(c.c.served_at.is_not(None), c.c.served_at, c.c.served_rank, c.c.name)
            .limit(bindparam("most_channels", type_=Integer())))


__all__ = ["CHANNEL_LOOK_INTERVAL", "ChannelAdmin", "ChannelSql", "ChannelStatements",
           "effective"]
