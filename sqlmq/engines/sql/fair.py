"""The fair order of channels without limits, on the SQL engines (schema version 13; the
model is :mod:`sqlmq.channels`): what the acquire that takes them in ``fair_key`` order does
(each database's own statements; the queue's clock, :func:`moved_clocks`), the passing of an
ordered channel's turn, the settings-driven upkeep of the order (:func:`rekey`), and the
engine's lookouts, which skip a part of the acquire until what it serves exists."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sqlalchemy import (
    BigInteger,
    and_,
    bindparam,
    case,
    exists,
    func,
    literal,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from ...backoff import FailureRun
from ...channels import (
    BLOCKED,
    ORDERED_LOOKAHEAD,
    ORDERED_PARK_AFTER,
    ORDERED_PRIORITY,
    TURN_BITS,
    ChannelSettings,
    Turns,
    first_turn,
    turn_of,
    window_room,
)
from ...lifecycle import State
from ...records import Delivery
from ...schema import MAX_PRIORITY, Schema
from ...sqltime import db_now_plus
from .operations import not_paused

log = logging.getLogger("sqlmq")
_NOW = db_now_plus(literal(0.0))
_BLOCKED = literal(BLOCKED, BigInteger())
_WAITING = (State.PENDING.value, State.RETRYABLE.value)
#: How often an engine that has not seen what a part of the acquire serves (a channel, a
#: limit, a channel without limits) looks again whether it exists: another process may
#: have made it. Until then that part is skipped.
CHANNEL_LOOK_INTERVAL = 1.0
#: How often at most the mending parks the windows of ordered heads that wait long
#: (:class:`Parking`): a head is parked only once it waits more than
#: :data:`~sqlmq.channels.ORDERED_PARK_AFTER` anyway, and a pass reads every ordered
#: channel's head (10-17 ms for 1,500 channels, where letting in reads 2-4 ms).
PARK_INTERVAL = ORDERED_PARK_AFTER

Transaction = Callable[[Callable[[AsyncConnection], Awaitable[Any]]], Awaitable[Any]]


class Aside:
    """Database work an acquire leaves to a task of its own, one at a time: its failures
    logged once per run of them (with the traceback when unexpected), never raised into
    the acquire."""

    what: str
    task: asyncio.Task[None] | None = None
    failed: FailureRun
    #: What the first failure's line says comes next, before the interval.
    AGAIN = "again in"

    def _spawn(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work()`` in a task (made there: a task cancelled before it starts leaves
        no coroutine unawaited)."""
        self.task = asyncio.get_running_loop().create_task(
            self._guarded(work), name=f"sqlmq {self.what}")

    async def _guarded(self, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except Exception as exc:  # not a cancellation: close() stops the work that way
            self.failed.note(exc, f"{self.AGAIN} {CHANNEL_LOOK_INTERVAL:.1f} s")
        else:
            self.failed.succeeded()
        finally:
            self.task = None
            self._ended()

    def _ended(self) -> None:
        pass

    async def close(self) -> None:
        """Stop the work under way (the engine is closing)."""
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@dataclass
class Lookout(Aside):
    """Whether something that, once made, stays (a channel, a limit, a channel without
    limits) exists: seen when this engine makes it (:meth:`saw`), else looked for at most
    every :data:`CHANNEL_LOOK_INTERVAL` by ``look`` (a row, or None).

    Only the first look is the caller's: the later ones run in the background, the
    caller going on with what was known. Each was a transaction of its own in the middle
    of an acquire, once a second: at 100 msg/s on PostgreSQL, 1.7 ms (up to 11 ms) added
    to about one delivery in a hundred, the whole of the latency's p99. Until a look
    succeeds, what it looks for is taken as absent, as before the first."""

    look: Callable[[AsyncConnection], Awaitable[Any]]
    what: str = "a channel"
    seen: bool = False
    looked_at: float = field(default=float("-inf"))
    task: asyncio.Task[None] | None = None
    failed: FailureRun = field(init=False)
    AGAIN = "looking again every"

    def __post_init__(self) -> None:
        self.what = f"looking for {self.what}"
        self.failed = FailureRun(self.what, tries="looks")

    def saw(self) -> None:
        self.seen = True

    async def sees(self, transaction: Transaction) -> bool:
        if self.seen:
            return True
        now = time.monotonic()
        if now - self.looked_at < CHANNEL_LOOK_INTERVAL or self.task is not None:
            return False
        first = self.looked_at == float("-inf")
        self.looked_at = now
        if first:
            self.seen = await transaction(self.look) is not None
        else:
            self._spawn(lambda: self._look(transaction))
        return self.seen

    async def _look(self, transaction: Transaction) -> None:
        self.seen = self.seen or await transaction(self.look) is not None

    def _ended(self) -> None:
        self.looked_at = time.monotonic()


@dataclass
class HeadMending(Aside):
    """Lets in (:func:`promotion`) the first blocked message of every ordered channel
    with none below :data:`~sqlmq.channels.BLOCKED`, at most every
    :data:`CHANNEL_LOOK_INTERVAL`, and parks (:class:`Parking`) the windows of those whose
    head waits long to start again, at most every :data:`PARK_INTERVAL`, beside an
    acquire that found less than it could take.

    The acquire lets one in each time it takes a head, so a window runs out with blocked
    messages behind it only when the messages in it stop waiting other than by being
    taken (cancelled, deleted, expired), or when a publish read the channel, under its
    row's lock, just as an acquire that does not lock that row took the head: the
    publish saw the window full and blocked its own; the take's letting in, in a
    snapshot from before the publish, found nothing to let in. Those are rare; a pass
    costs a few index probes per ordered channel."""

    mend: Callable[[AsyncConnection], Awaitable[int]]
    park: Callable[[AsyncConnection], Awaitable[int]]
    what: str = "letting in the next messages of ordered channels"
    mended_at: float = field(default=float("-inf"))
    parked_at: float = field(default=float("-inf"))
    #: Messages let in, and parked, by the passes (figures for tests and operators).
    let_in: int = 0
    parked: int = 0
    task: asyncio.Task[None] | None = None
    failed: FailureRun = field(init=False)

    def __post_init__(self) -> None:
        self.failed = FailureRun(self.what)

    def due(self, transaction: Transaction) -> None:
        """Start a pass unless one runs or ran less than the interval ago."""
        now = time.monotonic()
        if self.task is None and now - self.mended_at >= CHANNEL_LOOK_INTERVAL:
            self.mended_at = now
            self._spawn(lambda: self._pass(transaction))

    async def _pass(self, transaction: Transaction) -> None:
        n = await transaction(self.mend)
        if n:
            self.let_in += n
            log.debug("let in the next message of %d ordered channel(s) that had none", n)
        if time.monotonic() - self.parked_at < PARK_INTERVAL:
            return
        self.parked_at = time.monotonic()
        if n := await transaction(self.park):
            self.parked += n
            log.debug("parked %d message(s) behind ordered heads that wait to start", n)

    def _ended(self) -> None:
        self.mended_at = time.monotonic()


class Mending:
    """Lets in the first blocked message of each ordered channel without other limits
    that has none below :data:`~sqlmq.channels.BLOCKED` (:func:`promotion`'s mending),
    once a plain read has found such channels: most passes find none, and write nothing.
    Why two steps: MariaDB takes shared locks on the index entries that an update's
    subqueries read in the table it updates, and the update alone read the first entry
    of every ordered channel, running heads included; a settle deleting two of those heads
    in id order deadlocked with it (``SHOW ENGINE INNODB STATUS``, a drain of 1,000
    ordered channels), and every settle waited for the pass meanwhile. Now the update
    reads only the channels found, rechecked."""

    def __init__(self, schema: Schema) -> None:
        c, d = schema.channel, schema.channel_default
        o = schema.message.alias("o")
        self.candidates = (
            select(c.c.name).select_from(with_default(schema))
            .where(_ordered_free(c, d),
                   exists().where(o.c.channel == c.c.name, o.c.fair_key >= _BLOCKED),
                   _short(schema, c.c.name, 0))
            .order_by(c.c.name))
        self.let_in = promotion(schema, among=c.c.name.in_(bindparam("names", expanding=True)))

    async def run(self, conn: AsyncConnection) -> int:
        names = list((await conn.execute(self.candidates)).scalars())
        if not names:
            return 0
        return (await conn.execute(self.let_in, {"names": names})).rowcount


class Parking:
    """Blocks again the window of each ordered channel without other limits whose head
    waits more than :data:`~sqlmq.channels.ORDERED_PARK_AFTER` to start again (at most
    :attr:`BATCH` channels a pass): its messages in the fair read behind the head get
    :data:`~sqlmq.channels.BLOCKED` added to their keys, so acquires stop reading them,
    and each take of the head lets one in again (:func:`promotion`). Only the head's
    followers, all of them: what stays below BLOCKED is still a prefix of the channel's
    key order, and its order among the blocked ones is unchanged.

    Under the channels' row locks (by name, skipping those held: a publish that holds
    one gets its turns under it, and blocks its own when the channel has blocked ones, so
    nothing it writes can come before what a pass blocks), and the head read again by the
    update: one that was taken, cancelled or made due meanwhile parks nothing."""

    BATCH = 1000

    def __init__(self, schema: Schema) -> None:
        m, c, d = schema.message, schema.channel, schema.channel_default
        self.candidates = (
            select(c.c.name).select_from(with_default(schema))
            .where(_ordered_free(c, d), _waits_long(schema, c.c.name),
                   ~_short(schema, c.c.name, 1))
            .order_by(c.c.name).limit(self.BATCH))
        names = bindparam("names", expanding=True)
        self.lock = (select(c.c.name).where(c.c.name.in_(names)).order_by(c.c.name)
                     .with_for_update(skip_locked=True))
        f = m.alias("f")
        # Read through a derived table, as promotion's: MySQL's rule for an update that
        # reads its own table.
        followers = select(f.c.id).where(
            f.c.channel.in_(names), f.c.fair_key < _BLOCKED, f.c.state.in_(_WAITING),
            _waits_long(schema, f.c.channel, besides=f.c.id)).subquery("x")
        self.block = (update(m).where(m.c.id.in_(select(followers.c.id)),
                                      m.c.fair_key < _BLOCKED)
                      .values(fair_key=m.c.fair_key + _BLOCKED))

    async def run(self, conn: AsyncConnection) -> int:
        names = list((await conn.execute(self.candidates)).scalars())
        if names:
            names = list((await conn.execute(self.lock, {"names": names})).scalars())
        if not names:
            return 0
        return (await conn.execute(self.block, {"names": names})).rowcount


@dataclass
class Lookouts:
    """An engine's: any channel; any limit (a channel's own or a queue default's); any
    channel without limits; any ordered channel without other limits (whose heads may
    need mending, :class:`HeadMending`)."""

    channels: Lookout
    limits: Lookout
    free: Lookout
    ordered: Lookout

    @classmethod
    def of(cls, schema: Schema) -> Lookouts:
        c, d = schema.channel, schema.channel_default

        async def channels(conn: AsyncConnection) -> Any:
            return (await conn.execute(select(c.c.name).limit(1))).first()

        async def limits(conn: AsyncConnection) -> Any:
            own = select(c.c.name).where(c.c.configured == 1, _has_limits(c)).limit(1)
            default = select(d.c.queue).where(_has_limits(d)).limit(1)
            return ((await conn.execute(own)).first()
                    or (await conn.execute(default)).first())

        async def free(conn: AsyncConnection) -> Any:
            return (await conn.execute(select(c.c.name).select_from(with_default(schema))
                                       .where(~limited(c, d)).limit(1))).first()

        async def ordered(conn: AsyncConnection) -> Any:
            return (await conn.execute(select(c.c.name).select_from(with_default(schema))
                                       .where(_ordered_free(c, d)).limit(1))).first()

        return cls(Lookout(channels, "a channel"), Lookout(limits, "a channel limit"),
                   Lookout(free, "a channel without limits"),
                   Lookout(ordered, "an ordered channel"))

    async def close(self) -> None:
        for lookout in (self.channels, self.limits, self.free, self.ordered):
            await lookout.close()


class FairAcquire:
    """The fair half of the channels' acquire for :class:`~.engine.SqlEngine`."""

    schema: Schema
    db: Any
    _transaction: Transaction
    _take: Callable[..., Awaitable[list[Delivery]]]
    #: Per list of queues: the channels the last fair acquire took from (how many share
    #: an acquire with the limited ones).
    _fair_spread: dict[tuple[str, ...], int]

    @cached_property
    def _lookouts(self) -> Lookouts:
        return Lookouts.of(self.schema)

    @cached_property
    def _mending(self) -> HeadMending:
        return HeadMending(Mending(self.schema).run, Parking(self.schema).run)

    async def _close_lookouts(self) -> None:
        if "_lookouts" in self.__dict__:
            await self._lookouts.close()
        if "_mending" in self.__dict__:
            await self._mending.close()

    def _saw_channels(self) -> None:
        self._lookouts.channels.saw()

    def _saw_limits(self) -> None:
        self._lookouts.limits.saw()

    def _saw_free_channel(self) -> None:
        self._lookouts.free.saw()

    @cached_property
    def _fair_sql(self) -> FairSql:
        return FairSql(self.schema)

    async def _acquire_fair(self, queues: Sequence[str], limit: int,
                            lease: float) -> list[Delivery]:
        """The due messages of channels without limits, in ``fair_key`` order (priority,
        then turn: round-robin across channels), in one transaction: picked and locked
        (``SKIP LOCKED``; SQLite's BEGIN IMMEDIATE holds other writers off), taken, and the
        queue's clock moved to the lowest turn taken (:func:`moved_clocks`), so that a
        channel that had nothing waiting joins this round. An ordered channel's message
        is picked only while nothing of its channel comes before it in key order. No
        channel row is locked or written: nothing about these channels needs counting. A
        limit set on one of them applies from the next acquire, as to the deliveries
        already running. Taking an ordered channel's head lets its next message in
        (:func:`promotion`). The rows taken are decoded after the commit.

        Each database has its own: PostgreSQL's one statement (ACQUIRE_FAIR), MariaDB's
        one packet, SQLite's statements straight on the driver (:mod:`..sqlite.channels`)."""
        raise NotImplementedError

    async def _let_in(self, conn: AsyncConnection, names: list[str]) -> None:
        """Let in the next message of each of the ordered channels ``names`` whose head
        this transaction took (:func:`promotion`)."""
        await conn.execute(self._fair_sql.let_in, {"names": names})

    async def _pass_heads(self, conn: AsyncConnection, names: list[str],
                          queues: Sequence[str], lease: float) -> list[Delivery]:
        """Start the next message of each of the ordered channels ``names`` whose head
        this transaction's settle archived or put back (``settle_passing``): the
        channel's first in key order, if it waits, is due and is below
        :data:`~sqlmq.channels.BLOCKED`; letting the next one in as the fair acquire's
        take of a head does. The take checks again that it waits (another process's
        acquire cannot have started it: until this commits, it sees the head before
        it)."""
        found = await self._next_heads(conn, names, queues)
        if not found:
            return []
        mine = set(names)
        out = await self._take(conn, {r.id: (r.channel, r.channel_due_at) for r in found},
                               lease, mine, mine)
        if out:
            await self._let_in(conn, sorted({d.channel for d in out}))
        return out


    async def _next_heads(self, conn: AsyncConnection, names: list[str],
                          queues: Sequence[str]) -> Sequence[Any]:
        """The first message in key order of each of the ordered channels ``names``, where
        it may start (:func:`_next_in_order`), with ``id``, ``channel`` and
        ``channel_due_at``."""
        return (await conn.execute(self._fair_sql.next_in_order,
                                   {"names": names, "queues": list(queues)})).all()


class FairSql:
    """The statements of :meth:`FairAcquire._pass_heads`, built once per engine."""

    def __init__(self, schema: Schema) -> None:
        self.let_in = promotion(schema, schema.channel.c.name.in_(
            bindparam("names", expanding=True)))
        self.next_in_order = _next_in_order(schema)


def moved_clocks(rows: Sequence[Any], clocks: Mapping[str, int]) -> dict[str, int]:
    """The queues whose clock the fair acquire of ``rows`` (with ``queue`` and
    ``fair_key``) moves on: each to the lowest turn taken of it, where that is past the
    turn this engine last wrote (``clocks``)."""
    lowest: dict[str, int] = {}
    for r in rows:
        turn = turn_of(r.fair_key)
        lowest[r.queue] = min(lowest.get(r.queue, turn), turn)
    return {q: t for q, t in sorted(lowest.items()) if t > clocks.get(q, 0)}


async def rekey(conn: AsyncConnection, schema: Schema, names: Any,
                settings: ChannelSettings) -> None:
    """Keep the fair order true to the ``settings`` of channels ``names`` (a list, or a
    select of names), whose rows the caller has locked or changed: under limits their
    messages leave it (``fair_key`` NULL: the limited acquire takes them); without, those
    that have no key get turns as a publish gives them, one per message in id order after
    the channel's last turn or its queue's clock. Ordered, every message gets a new key
    without its priority, its running ones first: key order is then the order they may
    start in, whatever keys the earlier settings gave, and the waiting ones past the first
    :data:`~sqlmq.channels.ORDERED_WINDOW` wait :data:`~sqlmq.channels.BLOCKED`, all of
    them marked ``ordered`` (what the fair acquire reads instead of the channel's settings);
    no longer ordered, blocked keys are given anew and the marks taken off."""
    c, m, k = schema.channel, schema.message, schema.channel_clock
    mine = m.c.channel.in_(names)
    if settings.limited or settings.ordered:
        await conn.execute(update(m).where(mine, m.c.fair_key.is_not(None))
                           .values(fair_key=None, ordered=0))
    else:  # blocked keys, of an ordered channel that is no longer: out of the fair read
        await conn.execute(update(m).where(mine, m.c.fair_key >= _BLOCKED)
                           .values(fair_key=None))
        await conn.execute(update(m).where(mine, m.c.ordered != 0).values(ordered=0))
    if settings.limited:
        return
    keyless = (await conn.execute(select(m.c.id, m.c.channel, m.c.priority, m.c.state).where(
        mine, m.c.fair_key.is_(None)).order_by(
            m.c.state != State.PROCESSING.value, m.c.id))).all()
    if not keyless:
        return
    channels = {r.name: r for r in await conn.execute(
        select(c.c.name, c.c.queue, c.c.last_turn).where(
            c.c.name.in_({r.channel for r in keyless})))}
    clocks = dict((await conn.execute(select(k.c.queue, k.c.turn))).all())
    last = {name: first_turn(r.last_turn, clocks.get(r.queue)) - 1
            for name, r in channels.items()}
    keys = []
    waiting: dict[str, int] = {}  # per ordered channel, how many wait in its window
    for r in keyless:
        last[r.channel] += 1
        room = None
        if settings.ordered and r.state != State.PROCESSING.value:
            room = window_room(waiting.get(r.channel, 0), False)
            waiting[r.channel] = waiting.get(r.channel, 0) + 1
        keys.append({"i": r.id, "k": Turns(last[r.channel], settings.ordered, room)
                     .key(r.priority)})
    await conn.execute(update(m).where(m.c.id == bindparam("i")).values(
        fair_key=bindparam("k"), ordered=int(settings.ordered)), keys)
    await conn.execute(update(c).where(c.c.name == bindparam("n")).values(
        last_turn=bindparam("t")), [{"n": n, "t": t} for n, t in last.items()])


def requeued_order(archive: Any, turns: dict[str, Turns]) -> Any:
    """The ``ordered`` mark of an archived row requeued to its channel: 1 if
    :func:`requeued_key` gives it an ordered channel's key."""
    ordered = {name: literal(1) for name, t in turns.items() if t.ordered}
    return case(ordered, value=archive.c.channel, else_=literal(0)) if ordered else literal(0)


def requeued_key(archive: Any, turns: dict[str, Turns]) -> Any:
    """The ``fair_key`` of an archived row requeued to its channel (``turns``: each
    channel's, from :func:`room_flow`; an ordered channel's leave the priority out, and
    are :data:`~sqlmq.channels.BLOCKED` if its window was full or had blocked ones behind
    it; they share a turn, so else all of them go into it, which only widens it): NULL
    for a row without a channel."""
    if not turns:
        return null()
    turn = case({name: literal(t.first + (BLOCKED if t.blocks() else 0), BigInteger())
                 for name, t in turns.items()}, value=archive.c.channel)
    ordered = {name: literal(ORDERED_PRIORITY) for name, t in turns.items() if t.ordered}
    priority = (case(ordered, value=archive.c.channel, else_=archive.c.priority)
                if ordered else archive.c.priority)
    return ((literal(MAX_PRIORITY) - priority)
            * literal(1 << TURN_BITS, BigInteger()) + turn)


def _has_limits(t: Any) -> Any:
    """A channel row's own settings (or a default row's) have limits an acquire counts or
    times under the row's lock."""
    return or_(t.c.max_concurrency.is_not(None), t.c.rate.is_not(None))


def limited(c: Any, d: Any) -> Any:
    """A channel row (``c``, its queue's default ``d`` outer-joined) has limits that an
    acquire must count or time (:attr:`sqlmq.channels.ChannelSettings.limited`)."""
    own = c.c.configured == 1
    return or_(case((own, c.c.max_concurrency), else_=d.c.max_concurrency).is_not(None),
               case((own, c.c.rate), else_=d.c.rate).is_not(None))


def is_ordered(c: Any, d: Any) -> Any:
    """A channel row (``c``, its queue's default ``d`` outer-joined) is ordered."""
    own = c.c.configured == 1
    return func.coalesce(case((own, c.c.ordered), else_=d.c.ordered), 0) != 0


def _ordered_free(c: Any, d: Any) -> Any:
    """A channel row (``c``, ``d`` outer-joined) is ordered without other limits
    (:func:`.statements.fair_kind` 1): the channels whose messages may wait blocked."""
    return and_(is_ordered(c, d), ~limited(c, d))


def with_default(schema: Schema) -> Any:
    """The channel table with its queue's default outer-joined, as :func:`limited` and
    :func:`is_ordered` read it."""
    c, d = schema.channel, schema.channel_default
    return c.outerjoin(d, d.c.queue == c.c.queue)


def _next_in_order(schema: Schema) -> Any:
    """The first message in key order of each of the channels ``names`` (a settle's
    ordered channels), where it waits in the ``queues`` (not paused), is due and is below
    :data:`~sqlmq.channels.BLOCKED`: one probe of the index ``(channel, fair_key, id)``
    per channel, whatever its backlog. A head still running or waiting to retry is its
    channel's first, and holds it back."""
    m, c = schema.message, schema.channel
    return (select(m.c.id, m.c.channel, m.c.channel_due_at)
            .select_from(c.join(m, m.c.id == _first_id(schema, c.c.name)))
            .where(c.c.name.in_(bindparam("names", expanding=True)),
                   m.c.queue.in_(bindparam("queues", expanding=True)),
                   m.c.state.in_(_WAITING), m.c.fair_key < _BLOCKED,
                   m.c.channel_due_at <= _NOW, not_paused(schema, m.c.queue))
            .order_by(m.c.fair_key, m.c.id))


def window_of(schema: Schema, channel: Any) -> Any:
    """Ordered channel ``channel``'s window: how many of its messages wait in it
    (``waiting``, below :data:`~sqlmq.channels.BLOCKED`: about
    :data:`~sqlmq.channels.ORDERED_WINDOW` at most, so a count of one short index range),
    and whether any wait blocked behind it (``blocked``)."""
    u, b = schema.message.alias("u"), schema.message.alias("b")
    waiting = (select(func.count()).select_from(u)
               .where(u.c.channel == channel, u.c.fair_key < _BLOCKED,
                      u.c.channel_due_at.is_not(None)).scalar_subquery())
    blocked = exists().where(b.c.channel == channel, b.c.fair_key >= _BLOCKED)
    return select(waiting.label("waiting"), blocked.label("blocked"))


def _first_id(schema: Schema, channel: Any) -> Any:
    """The id of ``channel``'s first message in key order, in any state: its head.
    Correlated to whatever ``channel`` is a column of, at any depth: left to itself, a
    subquery nested in another's (:func:`_waits_long`'s) took that table into its own
    FROM and read the first message of every channel."""
    u = schema.message.alias("u")
    return (select(u.c.id).where(u.c.channel == channel, u.c.fair_key.is_not(None))
            .order_by(u.c.fair_key, u.c.id).limit(1).correlate_except(u).scalar_subquery())


def _waits_long(schema: Schema, channel: Any, besides: Any = None) -> Any:
    """``channel``'s head waits, and is due more than
    :data:`~sqlmq.channels.ORDERED_PARK_AFTER` from now (:class:`Parking`); with
    ``besides`` (an id), the head is another message than that one."""
    h = schema.message.alias("h")
    other = [] if besides is None else [h.c.id != besides]
    return (exists().where(h.c.id == _first_id(schema, channel), *other,
                           h.c.state.in_(_WAITING),
                           h.c.channel_due_at > db_now_plus(literal(ORDERED_PARK_AFTER)))
            .correlate_except(h))


def _short(schema: Schema, channel: Any, n: int) -> Any:
    """``channel`` has fewer than ``n + 1`` messages below :data:`~sqlmq.channels.BLOCKED`
    (in any state, its head first, running or not): its ``n``-th message (from 0) in key
    order is blocked, or missing. Counted in messages, not turns: a channel's turns jump
    when a publish finds its queue's clock ahead (``first_turn``). One probe of the index
    ``(channel, fair_key, id)`` that reads ``n + 1`` entries: filtered to keys below
    BLOCKED, MariaDB's read of it (by channel alone) went on through every blocked one to
    find the ``n``-th below (985 rows a channel)."""
    u = schema.message.alias("u")
    nth = (select(u.c.fair_key).where(u.c.channel == channel, u.c.fair_key.is_not(None))
           .order_by(u.c.fair_key, u.c.id).limit(1).offset(n).scalar_subquery())
    return func.coalesce(nth, _BLOCKED) >= _BLOCKED


def promotion(schema: Schema, channels: Any = None, among: Any = None) -> Any:
    """Let in (take :data:`~sqlmq.channels.BLOCKED` off the key of) the first blocked
    message, in key order, of each of the ``channels`` (a condition on channel row ``c``)
    with fewer than :data:`~sqlmq.channels.ORDERED_LOOKAHEAD` waiting behind its head in
    the fair read (its head was just taken: the acquire's letting in); or, ``channels``
    None (the mending), of each ordered channel without other limits that has nothing
    below BLOCKED (the window ran out otherwise; each take refills the window, so a
    mending that refilled short ones would only widen them), ``among`` those (a
    condition on ``c``, :class:`Mending`'s names) if given. The last condition makes a
    concurrent letting in of the same message (PostgreSQL rechecks it on the newest row)
    write once. :func:`.statements.let_in` is the raw-SQL twin."""
    m, c, d = schema.message, schema.channel, schema.channel_default
    o = m.alias("o")
    first_blocked = (select(o.c.id).where(o.c.channel == c.c.name, o.c.fair_key >= _BLOCKED)
                     .order_by(o.c.fair_key, o.c.id).limit(1).scalar_subquery())
    firsts = select(first_blocked.label("id"))
    if channels is None:
        firsts = firsts.select_from(with_default(schema)).where(
            _ordered_free(c, d), _short(schema, c.c.name, 0),
            *([] if among is None else [among]))
    else:
        firsts = firsts.where(channels, _short(schema, c.c.name, ORDERED_LOOKAHEAD))
    # Read through a derived table: MySQL refuses an update whose subquery reads the
    # table it updates, unless that read is materialized first.
    firsts = firsts.subquery("n")
    return (update(m).where(m.c.id.in_(select(firsts.c.id)), m.c.fair_key >= _BLOCKED)
            .values(fair_key=m.c.fair_key - _BLOCKED))


__all__ = ["CHANNEL_LOOK_INTERVAL", "FairAcquire", "HeadMending", "Lookout", "Lookouts",
           "is_ordered", "limited", "moved_clocks", "promotion", "rekey", "requeued_key",
           "requeued_order", "window_of", "with_default"]
