"""Channels: flow control inside a queue (schema version 10).

A message may name a *channel* when it is published (``channel="tenant-42"``). Messages of a
channel wait apart from the queue's plain ones (``channel_due_at`` instead of
``next_attempt_at``, which the plain acquire reads), and an acquire takes them channel by
channel, under the channel's settings, stored in the database so every process sees them:

* ``max_concurrency``: at most this many of its deliveries PROCESSING at once. The count is
  read from the message rows themselves, under the channel row's lock, so no counter can
  drift: a stale settlement is fenced and frees nothing, a delivery whose process died
  holds its slot until its lease expires and lease recovery moves it back (exactly once, as
  for every message), and a recovered message counts like any other.
* ``rate``: at most this many starts per second: a start moves the channel's
  ``next_start_at`` one interval on (from where it was, if the start came within an
  interval of it, so polling delays are not lost; else from now, so no burst is saved up).
* ``ordered``: strict FIFO. Only the channel's first message in publish order may start,
  and only once the one before it is archived: a failing head retries in place and holds
  back only its own channel. A message's priority does not move it ahead in its ordered
  channel. (Without other limits, publish order is the fair order below, with the
  message's id breaking a tie; with a rate or a concurrency limit, it is the id.)
* ``max_size``: a publish that would leave more messages than this in the channel (waiting
  and running) is refused with :class:`~sqlmq.errors.ChannelFull`, nothing written.

A channel without settings of its own takes the default of the queue it was first published
to (``set_channel_default``), else has no limits.

**Fair sharing** (schema version 13), so a channel with a long backlog does not starve the
others. Each channel message is given a *turn* when it is published: the channel's next
turn after its last one, or, if that has passed (the channel had nothing waiting), the
turn its queue is being served at (the queue's clock, moved on by the acquires). So the
first messages of every channel share turn 1, the second ones turn 2 and so on, and a
channel that joins late joins the current round rather than the back of everyone's
backlog. The message's ``fair_key`` packs its priority above its turn, and channels
without limits are taken in ``fair_key`` order: one ordered read of an index, as plain
messages are taken, round-robin across channels, up to :data:`TURN_QUANTUM` messages of a
channel in its turn (turns 1-8 share a key, 9-16 the next, ties taken in id order). An
ordered channel without other limits is taken the same way (its keys leave the priority
out, :data:`ORDERED_PRIORITY`, and each turn has its own), each of its messages only while
no message of the channel has a lower key: one probe of the index ``(channel, fair_key,
id)`` (schema version 14). Channels with limits are taken apart, least recently served
first, under their row locks, an even share each; they go first in an acquire, so that
their limits, not the unlimited channels' backlog, decide how much they run.

This module holds the model: settings, their validation, and what an acquire may take from
one channel. The engines do the reading and locking (:mod:`sqlmq.engines.sql.channels`,
and the in-memory engine).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .errors import ChannelFull, ConfigurationError
from .schema import MAX_PRIORITY
from .subscriber import check_name

#: A fair key's low bits hold the turn; those above them, the priority (highest first).
TURN_BITS = 46
_TURN_MASK = (1 << TURN_BITS) - 1
#: The priority an ordered channel's messages take in the fair order, whatever theirs.
ORDERED_PRIORITY = 0
#: Added to the key of an ordered channel's message that waits behind a full window (the
#: SQL engines'): above every other key, so the fair acquire's read of its index, which
#: stops below it, never meets it. Before, 10 ordered channels of 2,000 with their heads
#: running made every acquire read the 20,000 behind them, two probes each, to find
#: nothing (PostgreSQL 114 ms an acquire, 83 msg/s of 2,000; measured 2026-11-29). Messages are
#: let in (:data:`BLOCKED` taken off their key) in key order only, so those below it are
#: always a prefix of their channel's order: one each time the channel's head is taken
#: while fewer than :data:`ORDERED_LOOKAHEAD` wait behind it, and by the engines' mending
#: of a channel left with none (see :mod:`sqlmq.engines.sql.fair`). Which of those below
#: may start is decided as before, by key order (``(channel, fair_key, id)``); letting in
#: more than needed is never wrong.
BLOCKED = 1 << 62
#: How many of an ordered channel's waiting messages a publish leaves in the fair read
#: before it blocks the others. Letting one in is an update of its row's key (a new
#: version in every index on PostgreSQL: when every message of 1,000 channels of 20 was
#: let in, that drain went from 19,500 to 13,300 msg/s): within the window a publish blocks
#: nothing, so a channel that never holds more than this pays nothing. Each waiting
#: message in it, though, is read and refused by every acquire while its head runs, and
#: an acquire that cannot fill its batch reads them all. 8, not 32 as before (16 before
#: that), once the fair read no longer looked up each row's channel (schema version 19):
#: 1,000 ordered channels of 20 drained with the subscriber's defaults (fetch 1,000,
#: prefetch 2,000), alternating, msg/s: PostgreSQL 8,600-11,000 -> 12,100-12,800 (3 of 3
#: pairs, and 3 of 3 earlier), MariaDB 4,000-4,400 -> 6,000-7,100 (5 of 5), SQLite
#: 4,300-4,600 -> 5,200-6,200 (3 of 3); with the drain's tuned options (fetch 500) within
#: the noise on PostgreSQL and MariaDB, SQLite 5,300-7,500 -> 5,600-6,700.
ORDERED_WINDOW = 8
#: How many waiting messages a channel with blocked ones keeps in the fair read behind its
#: head: its takes let none in until the window is down to this, then one each. Each costs
#: every acquire that reads past it a look (two probes): a deep channel's full window of
#: 16 (the window then) made MariaDB's fair acquire 6 ms with ten such channels.
ORDERED_LOOKAHEAD = 2
#: An ordered channel whose head waits longer than this (seconds) to start again (a
#: retry's backoff, a defer) has the rest of its window blocked again by the engines'
#: mending: those messages cannot start before it, and every acquire read each of them to
#: refuse it (1,000 such channels of 20: 56-130 ms an acquire that took nothing, on the
#: three databases; 1-5 ms once parked). Taking the head lets them in again, one a take,
#: as after a publish beyond the window.
ORDERED_PARK_AFTER = 5.0
#: How many consecutive turns of a channel without limits share one key, so that a fair
#: drain takes its messages that many at a time: neighbours in the table, published
#: together. One at a time, a drain of 1,000 channels published one after the other
#: touched a page per message (twice: taken, then archived) where a plain drain touches a
#: page per dozen; on SQLite, which writes whole pages at each commit, 8 doubled that drain
#: (9,700 -> 19,000-21,000 msg/s; ``bench.run channels``, 2026-11-28). An ordered
#: channel's turns keep a key each (one of its messages runs at a time anyway), so its key
#: order stays its start order.
TURN_QUANTUM = 8


@dataclass(frozen=True, slots=True)
class ChannelSettings:
    """The limits of one channel (or a queue's default); None: no limit."""

    max_concurrency: int | None = None
    rate: float | None = None
    ordered: bool = False
    max_size: int | None = None

    @property
    def holds_slots(self) -> bool:
        """Whether a running delivery keeps others of the channel waiting until its result
        is written (a concurrency limit, or ordered): its result is worth writing at once."""
        return self.ordered or self.max_concurrency is not None

    @property
    def passes_slots(self) -> bool:
        """Whether a freed slot may go straight to the channel's next message in the
        settle that frees it: a concurrency limit and nothing else, or ordered and nothing
        else (its next message in key order, once its head is settled). A rate spaces the
        starts, and an ordered channel with a limit waits for its head under the channel's
        lock: both are decided by the acquire."""
        if self.ordered:
            return not self.limited
        return self.max_concurrency is not None and self.rate is None

    def __post_init__(self) -> None:
        for name in ("max_concurrency", "max_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ConfigurationError(f"{name} must be a whole number of at least 1 or "
                                         f"None (no limit), got {value!r}")
        rate = self.rate
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                                 or not math.isfinite(rate) or rate <= 0):
            raise ConfigurationError(f"rate must be a positive number of starts per second "
                                     f"or None (no limit), got {rate!r}")
        if not isinstance(self.ordered, bool):
            raise ConfigurationError(f"ordered must be True or False, got {self.ordered!r}")

    @property
    def limited(self) -> bool:
        """Whether an acquire must count or time the channel's starts under its row's lock
        (else its messages are taken in fair order, an ordered channel's head by head)."""
        return self.max_concurrency is not None or self.rate is not None

    @property
    def interval(self) -> float | None:
        """Seconds between two starts under ``rate``."""
        return None if self.rate is None else 1.0 / self.rate

    def as_row(self) -> dict[str, Any]:
        return {"max_concurrency": self.max_concurrency, "rate": self.rate,
                "ordered": int(self.ordered), "max_size": self.max_size}

    @classmethod
    def from_row(cls, row: Any) -> ChannelSettings:
        return cls(row.max_concurrency, None if row.rate is None else float(row.rate),
                   bool(row.ordered), row.max_size)


NO_LIMITS = ChannelSettings()


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """One channel as ``broker.channels()`` and ``sqlmq channels list`` show it."""

    name: str
    #: The queue it was first published to (whose default it takes when not configured).
    queue: str
    #: Its own settings, or None: it takes its queue's default (``effective``).
    settings: ChannelSettings | None
    effective: ChannelSettings
    waiting: int
    running: int
    last_served_at: datetime | None
    #: When the longest-waiting of its waiting messages became due (None: none waits), as
    #: :attr:`~sqlmq.records.QueueStats.oldest_ready_at` is a queue's.
    oldest_ready_at: datetime | None = None


def check_channel(name: Any) -> str:
    return check_name(name, "channel name")


def check_size(name: str, size: int, adding: int, limit: int) -> None:
    """Refuse a publish of ``adding`` messages to channel ``name``, which holds ``size``
    under a ``max_size`` of ``limit``, if they would exceed it."""
    if size + adding > limit:
        raise ChannelFull(
            f"channel {name!r} holds {size} messages and its max_size is {limit}: "
            f"{'this message' if adding == 1 else f'{adding} more'} would exceed it; "
            f"nothing was written")


def first_turn(last_turn: int, clock: int | None) -> int:
    """The turn of the first of a channel's new messages (the others follow one turn each):
    the one after the channel's last, or after its queue's ``clock`` if that is later
    (the channel had nothing waiting: it joins the round being served)."""
    return max(last_turn, clock or 0) + 1


def fair_key(priority: int, turn: int) -> int:
    """A channel message's place in its queue's fair order: higher priority first, then
    lower turn (ties: lower id)."""
    return ((MAX_PRIORITY - priority) << TURN_BITS) | (turn & _TURN_MASK)


@dataclass(frozen=True, slots=True)
class Turns:
    """The turns a publish (or a requeue) to a channel without limits was given: the
    first, the others following one each; ``ordered``: the channel's keys leave the
    priority out, so that its key order is its publish order. ``room``, in an ordered
    channel: how many of the new messages may wait in the fair read (the rest wait
    :data:`BLOCKED`); None: no limit (an engine that does not block, a backfill)."""

    first: int
    ordered: bool = False
    room: int | None = None

    def key(self, priority: int, i: int = 0) -> int:
        """The ``fair_key`` of the ``i``-th message of the publish: its turn's, or, in a
        channel not ordered, the first turn's of its :data:`TURN_QUANTUM`."""
        turn = self.first + i
        if self.ordered:
            return fair_key(ORDERED_PRIORITY, turn) + (BLOCKED if self.blocks(i) else 0)
        return fair_key(priority, turn - (turn - 1) % TURN_QUANTUM)

    def blocks(self, i: int = 0) -> bool:
        """Whether the ``i``-th message waits :data:`BLOCKED`."""
        return self.ordered and self.room is not None and i >= self.room


def window_room(waiting: int, blocked: bool) -> int:
    """How many new messages an ordered channel lets into the fair read, with ``waiting``
    there already and ``blocked`` whether any wait blocked (then none: the new ones go
    behind those)."""
    return 0 if blocked else max(0, ORDERED_WINDOW - waiting)


def turn_of(key: int) -> int:
    return key & _TURN_MASK


def share(limit: int, channels: int) -> int:
    """How many one channel may give to an acquire of ``limit`` spread over ``channels``:
    an even share, rounded up (the batch is cut at ``limit`` in serving order)."""
    return max(1, -(-limit // max(channels, 1)))


def allowance(settings: ChannelSettings, running: int, even_share: int) -> int:
    """What one acquire may start in a channel with ``running`` deliveries PROCESSING."""
    if settings.ordered:
        return 1 if running == 0 else 0
    n = even_share
    if settings.max_concurrency is not None:
        n = min(n, settings.max_concurrency - running)
    if settings.rate is not None:
        n = min(n, 1)
    return max(n, 0)


def freed_slots(applied: Iterable[int], slots: Mapping[int, str]) -> dict[str, int]:
    """Per channel, how many of the landed results ``applied`` were of deliveries that held
    one of its slots (``slots``: a result's id to that channel)."""
    freed: dict[str, int] = {}
    for msg_id in applied:
        if (channel := slots.get(msg_id)) is not None:
            freed[channel] = freed.get(channel, 0) + 1
    return freed


def passed_on(settings: ChannelSettings, freed: int, running: int) -> int:
    """How many of ``freed`` slots of a channel under ``settings``, with ``running``
    deliveries PROCESSING once they are freed, may go straight to its next messages in the
    settle that frees them (:attr:`ChannelSettings.passes_slots`): within its concurrency
    limit, or, ordered, one once nothing of it runs (which message: its first in key
    order, if that one is due)."""
    if not settings.passes_slots or freed <= 0:
        return 0
    if settings.ordered:
        return 1 if running == 0 else 0
    assert settings.max_concurrency is not None
    return max(0, min(freed, settings.max_concurrency - running))


def next_start(settings: ChannelSettings, planned: datetime | None,
               now: datetime) -> datetime | None:
    """The channel's ``next_start_at`` after a start at ``now``: one interval on from the
    planned start if that was less than an interval ago (keeping the cadence through polling
    delays), else from now (a quiet channel saves no burst up)."""
    interval = settings.interval
    if interval is None:
        return None
    step = timedelta(seconds=interval)
    if planned is not None and now - planned < step:
        return max(planned, now - step) + step
    return now + step


__all__ = ["BLOCKED", "NO_LIMITS", "ORDERED_LOOKAHEAD", "ORDERED_PARK_AFTER",
           "ORDERED_PRIORITY", "ORDERED_WINDOW", "TURN_BITS", "TURN_QUANTUM", "ChannelInfo",
           "ChannelSettings", "Turns", "allowance", "check_channel", "check_size",
           "fair_key", "first_turn", "freed_slots", "next_start", "passed_on", "share",
           "turn_of", "window_room"]
