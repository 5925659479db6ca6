"""Channels on the in-memory engine (the SQL engines': :mod:`..sql.channels`; the model:
:mod:`sqlmq.channels`). Every method runs under the engine's lock, one transaction."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ...channels import (
    NO_LIMITS,
    ChannelInfo,
    ChannelSettings,
    Turns,
    allowance,
    check_size,
    first_turn,
    next_start,
    passed_on,
    share,
    turn_of,
)
from ...lifecycle import State
from ...records import Delivery
from ...views import MessageView

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WAITING = (State.PENDING, State.RETRYABLE)


@dataclass(slots=True)
class ChannelRow:
    name: str
    queue: str
    settings: ChannelSettings | None = None  # None: its queue's default
    served_at: datetime | None = None
    served_rank: int = 0  # its place among the channels served at ``served_at``
    next_start_at: datetime | None = None
    last_turn: int = 0  # the turn its last message was given
    created_at: datetime | None = None  # None: made by set_channel (no clock at hand)


@dataclass
class MemoryChannels:
    channels: dict[str, ChannelRow] = field(default_factory=dict)
    defaults: dict[str, ChannelSettings] = field(default_factory=dict)
    #: Per list of queues: the soonest start of a channel waiting only for its rate, as
    #: the last acquire that found no channel to start saw it (see channel_start_in).
    rate_waits: dict[tuple[str, ...], datetime | None] = field(default_factory=dict)
    #: Per queue, the turn its channels without limits are served at.
    clocks: dict[str, int] = field(default_factory=dict)
    #: Per list of queues: the channels the last fair acquire took from.
    spread: dict[tuple[str, ...], int] = field(default_factory=dict)

    def effective(self, ch: ChannelRow) -> ChannelSettings:
        if ch.settings is not None:
            return ch.settings
        return self.defaults.get(ch.queue, NO_LIMITS)

    def admit(self, name: str, queue: str, adding: int, rows: Iterable[Any],
              now: datetime, refuse: bool = True) -> Turns | None:
        """Make channel ``name`` if need be; refuse ``adding`` more messages (a publish's,
        a requeue's) if they would exceed its ``max_size`` (``rows``: the table's rows);
        else, without limits, give them their turns (None: a channel with limits; see
        :mod:`sqlmq.channels`). ``refuse`` False: whatever the ``max_size`` (as
        :func:`..sql.room.room_flow`)."""
        ch = self.channels.get(name)
        if ch is None:
            ch = self.channels[name] = ChannelRow(name, queue, created_at=now)
        settings = self.effective(ch)
        if refuse and settings.max_size is not None:
            check_size(name, sum(1 for r in rows if r.channel == name), adding,
                       settings.max_size)
        if settings.limited:
            return None
        turn = first_turn(ch.last_turn, self.clocks.get(queue))
        ch.last_turn = turn + adding - 1
        return Turns(turn, settings.ordered)

    def set(self, name: str, queue: str | None, settings: ChannelSettings | None,
            rows: Iterable[Any]) -> bool:
        if settings is None and name not in self.channels:
            return False  # a reset makes nothing
        self.channels.setdefault(name, ChannelRow(name, queue or "")).settings = settings
        self.rekey([name], rows)
        return True

    def forget_idle(self, before: datetime, limit: int, rows: Iterable[Any],
                    now: datetime) -> int:
        """As :meth:`..sql.channels.ChannelAdmin.forget_idle_channels`."""
        used = {r.channel for r in rows}
        idle = sorted(name for name, ch in self.channels.items()
                      if ch.settings is None and name not in used
                      and (ch.created_at is None or ch.created_at < before)
                      and (ch.served_at is None or ch.served_at < before)
                      and (ch.next_start_at is None or ch.next_start_at <= now))[:limit]
        for name in idle:
            del self.channels[name]
        return len(idle)

    def set_default(self, queue: str, settings: ChannelSettings | None,
                    rows: Iterable[Any]) -> None:
        if settings is None:
            self.defaults.pop(queue, None)
        else:
            self.defaults[queue] = settings
        self.rekey([c.name for c in self.channels.values()
                    if c.queue == queue and c.settings is None], rows)

    def rekey(self, names: list[str], rows: Iterable[Any]) -> None:
        """As :func:`..sql.fair.rekey`: channels ``names``' messages leave the fair
        order under limits, and get turns (those without) when they have none; an ordered
        channel's all get new ones, its running ones first."""
        wanted = set(names)
        for r in sorted((r for r in rows if r.channel in wanted),
                        key=lambda r: (r.state != State.PROCESSING, r.id)):
            ch = self.channels[r.channel]
            settings = self.effective(ch)
            if settings.limited:
                r.fair_key = None
            elif r.fair_key is None or settings.ordered:
                ch.last_turn = first_turn(ch.last_turn, self.clocks.get(ch.queue))
                r.fair_key = Turns(ch.last_turn, settings.ordered).key(r.priority)

    def acquire(self, rows: Iterable[Any], queues: Sequence[str], limit: int, now: datetime,
                take: Callable[[Any, datetime | None], Delivery],
                key: tuple[str, ...]) -> list[Delivery]:
        """As :meth:`..sql.channels.ChannelStatements._acquire_channels`: the channels with
        limits, then the others in fair order with what is left of ``limit``."""
        rows = list(rows)
        out = self._acquire_limited(rows, queues, limit, now, take, key)
        if len(out) < limit:
            out += self._acquire_fair(rows, queues, limit - len(out), now, take, key)
        return out

    def _acquire_fair(self, rows: list[Any], queues: Sequence[str], limit: int,
                      now: datetime, take: Callable[[Any, datetime | None], Delivery],
                      key: tuple[str, ...]) -> list[Delivery]:
        """As :meth:`..sql.fair.FairAcquire._acquire_fair`: the due messages of
        channels without limits in ``fair_key`` order; the queues' clocks moved to the
        lowest turn taken."""
        wanted = set(queues)
        settings = {name: self.effective(ch) for name, ch in self.channels.items()}
        free = {name for name, s in settings.items() if not s.limited}
        first: dict[str, tuple[int, int]] = {}  # an ordered channel's first row, key order
        for r in rows:
            if r.channel in free and settings[r.channel].ordered and r.fair_key is not None:
                place = (r.fair_key, r.id)
                first[r.channel] = min(first.get(r.channel, place), place)
        due = sorted((r for r in rows if r.channel in free and r.state in _WAITING
                      and r.queue in wanted and r.fair_key is not None
                      and r.channel_due_at is not None and r.channel_due_at <= now
                      and (not settings[r.channel].ordered
                           or first[r.channel] == (r.fair_key, r.id))),
                     key=lambda r: (r.fair_key, r.id))[:limit]
        lowest: dict[str, int] = {}
        out = []
        for r in due:
            lowest[r.queue] = min(lowest.get(r.queue, turn_of(r.fair_key)), turn_of(r.fair_key))
            scheduled, r.channel_due_at = r.channel_due_at, None
            d = take(r, scheduled)
            d.holds_slot = d.passes_slot = settings[r.channel].ordered
            out.append(d)
        for queue, turn in lowest.items():
            self.clocks[queue] = max(self.clocks.get(queue, 0), turn)
        self.spread[key] = len({d.channel for d in out})
        return out

    def _acquire_limited(self, rows: list[Any], queues: Sequence[str], limit: int,
                         now: datetime, take: Callable[[Any, datetime | None], Delivery],
                         key: tuple[str, ...]) -> list[Delivery]:
        """As :meth:`..sql.channels.ChannelStatements._acquire_limited`: the channels with
        limits and a due message in ``queues``, least recently served first, each an even
        share (counting the channels the last fair acquire served) within its limits (an
        ordered one its head only); ``take`` acquires a row. ``key``: the subscriber's
        queues, under which to note when a rate lets a channel start again."""
        wanted = set(queues)
        of: dict[str, list[Any]] = {}
        for r in rows:
            if r.channel is not None:
                of.setdefault(r.channel, []).append(r)
        candidates = []
        rate_waits: list[datetime] = []
        for ch in sorted(self.channels.values(),
                         key=lambda c: (c.served_at is not None, c.served_at or _EPOCH,
                                        c.served_rank, c.name)):
            settings = self.effective(ch)
            if not settings.limited:
                continue
            mine = of.get(ch.name, [])
            due = _due(mine, wanted, now)
            if not due:
                continue
            if ch.next_start_at is not None and ch.next_start_at > now:
                rate_waits.append(ch.next_start_at)
                continue
            running = sum(1 for r in mine if r.state == State.PROCESSING)
            if allowance(settings, running, 1) > 0:
                candidates.append((ch, settings, running, mine, due))
        self.rate_waits[key] = None if candidates else min(rate_waits, default=None)
        out: list[Delivery] = []
        served = 0
        even = share(limit, len(candidates) + self.spread.get(key, 0))
        for ch, settings, running, mine, due in candidates:
            n = min(allowance(settings, running, even), limit - len(out))
            if settings.ordered:
                head = min(mine, key=lambda r: r.id)
                picked = [head] if head in due else []
            else:
                picked = sorted(due, key=_pick_order)[:n]
            if not picked:
                continue
            for r in picked:
                scheduled, r.channel_due_at = r.channel_due_at, None
                d = take(r, scheduled)
                d.holds_slot, d.passes_slot = settings.holds_slots, settings.passes_slots
                out.append(d)
            ch.served_at, ch.served_rank, served = now, served, served + 1
            ch.next_start_at = next_start(settings, ch.next_start_at, now)
            if len(out) >= limit:
                break
        return out

    def pass_slots(self, rows: Iterable[Any], freed: Mapping[str, int], queues: Sequence[str],
                   most: int, now: datetime,
                   take: Callable[[Any, datetime | None], Delivery]) -> list[Delivery]:
        """As :meth:`..sql.slots.SlotPassing._pass_slots`: up to ``freed[name]`` due
        messages of each channel with only a concurrency limit, within it, and the first
        message in key order of each ordered channel without other limits, if it waits
        and is due; ``most`` in all (a settle's freed slots passed on, the channel's
        running count unchanged)."""
        wanted = set(queues)
        of: dict[str, list[Any]] = {}
        for r in rows:
            if r.channel in freed:
                of.setdefault(r.channel, []).append(r)
        out: list[Delivery] = []
        for name in sorted(freed):
            ch = self.channels.get(name)
            if ch is None:
                continue
            mine = of.get(name, [])
            running = sum(1 for r in mine if r.state == State.PROCESSING)
            settings = self.effective(ch)
            n = min(passed_on(settings, freed[name], running), most - len(out))
            due = _due(mine, wanted, now)
            if settings.ordered:
                keyed = [r for r in mine if r.fair_key is not None]
                first = min(keyed, key=lambda r: (r.fair_key, r.id)) if keyed else None
                due = [first] if first is not None and first in due else []
            for r in sorted(due, key=_pick_order)[:max(n, 0)]:
                scheduled, r.channel_due_at = r.channel_due_at, None
                d = take(r, scheduled)
                d.holds_slot = d.passes_slot = True
                out.append(d)
        return out

    def infos(self, rows: Iterable[Any]) -> list[ChannelInfo]:
        waiting: dict[str, int] = {}
        running: dict[str, int] = {}
        oldest: dict[str, datetime] = {}
        for r in rows:
            if r.channel is not None:
                into = running if r.state == State.PROCESSING else waiting
                into[r.channel] = into.get(r.channel, 0) + 1
                due = r.next_attempt_at if r.next_attempt_at is not None else r.channel_due_at
                if r.state != State.PROCESSING and due is not None and (
                        r.channel not in oldest or due < oldest[r.channel]):
                    oldest[r.channel] = due
        return [ChannelInfo(c.name, c.queue, c.settings, self.effective(c),
                            waiting.get(c.name, 0), running.get(c.name, 0), c.served_at,
                            oldest.get(c.name))
                for c in sorted(self.channels.values(), key=lambda c: c.name)]


def _due(rows: list[Any], queues: set[str], now: datetime) -> list[Any]:
    """The waiting ``rows`` of a channel due by ``now`` in ``queues``."""
    return [r for r in rows if r.state in _WAITING and r.queue in queues
            and r.channel_due_at is not None and r.channel_due_at <= now]


def _pick_order(r: Any) -> tuple[int, datetime, int]:
    """A limited channel's acquire order: priority, due time, id."""
    return (-r.priority, r.channel_due_at, r.id)


class MemoryChannelAdmin:
    """The channel settings and listings of the contract for :class:`~.engine.MemoryEngine`."""

    _lock: threading.Lock
    _store: Any
    _now: Any
    message_view: Callable[[int], Awaitable[MessageView | None]]

    async def set_channel(self, name: str, queue: str | None,
                          settings: ChannelSettings | None) -> bool:
        with self._lock:
            return self._store.channels.set(name, queue, settings, self._store.rows.values())

    async def set_channel_default(self, queue: str, settings: ChannelSettings | None) -> None:
        with self._lock:
            self._store.channels.set_default(queue, settings, self._store.rows.values())

    async def forget_idle_channels(self, before: datetime, limit: int) -> int:
        with self._lock:
            store = self._store
            return store.channels.forget_idle(before, limit, store.rows.values(), self._now())

    async def channel_defaults(self) -> dict[str, ChannelSettings]:
        with self._lock:
            return dict(sorted(self._store.channels.defaults.items()))

    async def channels(self) -> list[ChannelInfo]:
        with self._lock:
            return self._store.channels.infos(self._store.rows.values())

    async def channel_served(self, window: float) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._lock:
            since = self._now() - timedelta(seconds=window)
            for a in self._store.archive.values():
                if a.channel is not None and a.archived_at >= since:
                    counts[a.channel] = counts.get(a.channel, 0) + 1
        return counts

    async def channel_messages(self, channel: str, limit: int) -> list[MessageView]:
        with self._lock:
            ids = sorted(r.id for r in self._store.rows.values() if r.channel == channel)
        # each seen as the message view shows it; one archived meanwhile is left out
        views = [await self.message_view(i) for i in ids[:limit]]
        return [v for v in views if v is not None and v.live]


__all__ = ["ChannelRow", "MemoryChannelAdmin", "MemoryChannels"]
