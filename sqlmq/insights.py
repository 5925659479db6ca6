"""What an operator reads about sqlmq, in one read-only layer that the CLI, the dashboard
and the metrics share (none of them writes its own SQL).

Everything comes from the engine contract's views (:mod:`sqlmq.views`) and is measured on
the database clock: counts by state, the age of the oldest ready message, what left each
queue over the last minute, quarter hour and hour, end-to-end latency percentiles (creation
to archive) of recent completed messages, deliveries per live message, and the archive,
searched by queue, state, error text and time and paginated by key.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .records import QueueStats
from .search import SearchResult
from .search import read as read_search
from .views import ArchiveQuery, MessageView, WindowCount
from .waits import LiveQuery, Wait

if TYPE_CHECKING:
    from .channels import ChannelInfo, ChannelSettings
    from .engines.contract import Engine
    from .schedules import ScheduleInfo

#: The rate windows, in seconds, and how they are shown.
WINDOWS: dict[str, float] = {"1m": 60.0, "15m": 900.0, "1h": 3600.0}
#: The counts of a :class:`~sqlmq.views.WindowCount` (and of a :class:`Bucket`).
_COUNTED = ("completed", "failed", "cancelled", "expired", "retried")
#: Latency percentiles are computed over at most this many of a queue's latest completed
#: messages of the last hour: enough for a stable p99, bounded on a busy queue.
LATENCY_SAMPLE = 10_000


@dataclass(frozen=True, slots=True)
class Latency:
    """Seconds from creation to archive over ``count`` recent completed messages."""

    count: int
    p50: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True, slots=True)
class QueueOverview:
    queue: str
    stats: QueueStats
    #: Seconds the oldest ready message has waited past its due time (None: none ready).
    oldest_ready_age: float | None
    #: What left the queue in each window of :data:`WINDOWS`, by its name.
    activity: dict[str, WindowCount]
    latency: Latency | None

    def rate(self, window: str = "1m") -> float:
        """Messages completed per second over ``window``."""
        return self.activity[window].completed / WINDOWS[window]


@dataclass(frozen=True, slots=True)
class QueueDetail:
    overview: QueueOverview
    #: Live messages by how many deliveries they have had (1: first run; more: retried or
    #: recovered after a crash).
    deliveries: dict[int, int]
    channels: list[ChannelInfo] = field(default_factory=list)
    schedules: list[ScheduleInfo] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Bucket:
    """What left a queue between ``start`` and ``end`` (database time): one point of a
    throughput chart."""

    start: datetime
    end: datetime
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0
    retried: int = 0


@dataclass(frozen=True, slots=True)
class ArchivePage:
    items: list[MessageView]
    #: The query for the next page (None: this was the last).
    next: ArchiveQuery | None


@dataclass(frozen=True, slots=True)
class LivePage:
    items: list[MessageView]
    #: The query for the next page (None: this was the last).
    next: LiveQuery | None


@dataclass(frozen=True, slots=True)
class ChannelOverview:
    """One channel as an operator watches it: its limits (its own, or else its queue's
    default), what waits and runs in it, and how fast it is served."""

    info: ChannelInfo
    #: Its queue's default limits (None: the queue has none).
    default: ChannelSettings | None
    #: Its messages archived per second over the last minute (:data:`WINDOWS` ``"1m"``):
    #: what a rate limit, which counts starts, bounds once the channel runs steadily.
    served_rate: float
    #: Seconds its oldest waiting message has waited past its due time (None: none due).
    oldest_ready_age: float | None


class Insights:
    """The read-only views over one engine (``broker.insights()``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def queues(self) -> list[QueueOverview]:
        """Every queue that has messages, live or archived, with its rates and latency."""
        stats = await self.engine.stats()
        now = await self.engine.now()
        activity = await self.engine.archive_activity(list(WINDOWS.values()))
        return [await self._overview(s, now, activity) for s in stats]

    async def queue(self, name: str) -> QueueDetail | None:
        """One queue in detail; None if it has no message, live or archived."""
        stats = next((s for s in await self.engine.stats() if s.queue == name), None)
        if stats is None:
            return None
        now = await self.engine.now()
        activity = await self.engine.archive_activity(list(WINDOWS.values()))
        overview = await self._overview(stats, now, activity)
        channels = [c for c in await self.engine.channels() if c.queue == name]
        schedules = [s for s in await self.engine.schedules() if s.queue == name]
        return QueueDetail(overview, await self.engine.delivery_counts(name), channels,
                           schedules)

    async def throughput(self, queue: str, *, span: float = 3600.0,
                         step: float = 120.0) -> list[Bucket]:
        """What left ``queue`` in each ``step`` seconds of the last ``span``, oldest first.

        One statement whatever the number of buckets: the archive's last ``span`` seconds
        of ``queue``, counted by bucket in the database."""
        return (await self.throughput_by_queue([queue], span=span, step=step))[queue]

    async def throughput_by_queue(self, queues: Iterable[str] | None = None, *,
                                  span: float = 3600.0,
                                  step: float = 60.0) -> dict[str, list[Bucket]]:
        """:meth:`throughput` of each of ``queues`` by name (None: of every queue that
        archived a message in the last ``span`` seconds). One statement for all of them,
        the same read as one queue's: a chart per queue on one page costs no more than one
        chart."""
        count = round(span / step) if step > 0 else 0
        if not 1 <= count <= 120:
            raise ValueError(f"a throughput chart has 1 to 120 buckets, got {span}/{step}")
        wanted = None if queues is None else list(queues)
        if wanted == []:
            return {}
        now = await self.engine.now()
        found = {q: _empty(now, count, step) for q in wanted or ()}
        only = wanted[0] if wanted is not None and len(wanted) == 1 else None
        for b in await self.engine.archive_buckets(count * step, step, only):
            if b.queue not in found:
                if wanted is not None:
                    continue
                found[b.queue] = _empty(now, count, step)
            at = count - 1 - b.index  # oldest first
            found[b.queue][at] = replace(found[b.queue][at],
                                         **{f: getattr(b, f) for f in _COUNTED})
        return found

    async def latency_percentiles(self, queue: str, points: int = 100) -> list[tuple[float,
                                                                                   float]]:
        """The latency distribution of ``queue``'s sample (see :attr:`QueueOverview.latency`)
        as ``(percentile, seconds)`` pairs from 0 to 100, at most ``points + 1`` of them:
        the whole curve, where the three percentiles show only three of its points."""
        sample = sorted(await self.engine.latency_sample(queue, WINDOWS["1h"], LATENCY_SAMPLE))
        if not sample:
            return []
        steps = min(points, len(sample))
        return [(100.0 * i / steps, sample[max(0, math.ceil(i / steps * len(sample)) - 1)])
                for i in range(steps + 1)]

    async def message(self, msg_id: int) -> MessageView | None:
        return await self.engine.message_view(int(msg_id))

    async def channels(self) -> list[ChannelOverview]:
        """Every channel, by queue then name, with its served rate and how long its oldest
        ready message has waited."""
        infos = await self.engine.channels()
        defaults = await self.engine.channel_defaults()
        served = await self.engine.channel_served(WINDOWS["1m"])
        now = await self.engine.now()
        return [ChannelOverview(
            c, defaults.get(c.queue), served.get(c.name, 0) / WINDOWS["1m"],
            None if c.oldest_ready_at is None or c.oldest_ready_at > now or not c.waiting
            else (now - c.oldest_ready_at).total_seconds())
            for c in sorted(infos, key=lambda c: (c.queue, c.name))]

    async def channel_messages(self, channel: str, limit: int = 100) -> list[MessageView]:
        """The live messages of ``channel`` (waiting and running), oldest first."""
        return await self.engine.channel_messages(channel, limit)

    async def search(self, text: str, *, limit: int = 50,
                     before: int | None = None) -> SearchResult:
        """The message whose id ``text`` is, live or archived, and the archived messages
        whose header values (but ``content-type``) or error have each word of ``text`` at
        a word's beginning, newest first: ``limit`` of them, with ids below ``before``
        (the previous page's :attr:`~sqlmq.search.SearchResult.next`). Words are runs of
        letters and digits, any case, of three or more (see :mod:`sqlmq.search`). The
        archive is read through each database's text index, not row by row.

        Raises ``ValueError`` naming what is wrong with ``text`` (nothing to look for, too
        long, too many words) or ``limit``."""
        if not 1 <= limit <= 500:
            raise ValueError(f"a search shows 1 to 500 messages a page, got {limit}")
        asked = read_search(text)
        found = None
        if asked.id is not None and before is None:
            found = await self.engine.message_view(asked.id)
        items = (await self.engine.search_archive_text(asked.words, limit, before)
                 if asked.words else [])
        return SearchResult(text.strip(), asked.id, found, asked.words, items,
                            items[-1].id if len(items) == limit else None)

    async def archive(self, query: ArchiveQuery) -> ArchivePage:
        items = await self.engine.search_archive(query)
        more = len(items) == query.limit
        return ArchivePage(items, _after(query, items[-1]) if more else None)

    async def archive_count(self, query: ArchiveQuery, most: int | None = None) -> int:
        """How many archived messages :meth:`archive` would show over all its pages,
        counting at most ``most`` (None: every one): what a bulk requeue or purge
        ``matching`` the search would move."""
        return await self.engine.count_archive(query, most)

    async def live(self, query: LiveQuery) -> LivePage:
        """A page of a queue's live messages by what they wait on (see :mod:`sqlmq.waits`)."""
        items = await self.engine.live_messages(query)
        more = len(items) == query.limit
        return LivePage(items, replace(query, after=items[-1].id) if more else None)

    async def waits(self, queue: str) -> dict[Wait, int]:
        """How many of ``queue``'s live messages wait on each :class:`~sqlmq.waits.Wait`,
        every one named (0: none)."""
        found = await self.engine.live_waits(queue)
        return {w: found.get(w.value, 0) for w in Wait}

    async def states(self, ids: Sequence[int]) -> dict[int, str]:
        """The state of each of ``ids`` that exists, live or archived (an id in neither
        table is left out): one read for a selection of many messages."""
        found = await self.engine.whereabouts([int(i) for i in ids]) if ids else {}
        return {i: w.state for i, w in found.items()}

    async def _overview(self, s: QueueStats, now: datetime,
                        activity: Sequence[WindowCount]) -> QueueOverview:
        windows = {w.window: w for w in activity if w.queue == s.queue}
        age = None
        waiting = s.pending or s.retryable
        if s.oldest_ready_at is not None and s.oldest_ready_at <= now and waiting:
            age = (now - s.oldest_ready_at).total_seconds()
        sample = await self.engine.latency_sample(s.queue, WINDOWS["1h"], LATENCY_SAMPLE)
        return QueueOverview(
            s.queue, s, age,
            {name: windows.get(seconds, WindowCount(s.queue, seconds))
             for name, seconds in WINDOWS.items()},
            latency_of(sample))


def latency_of(sample: Sequence[float]) -> Latency | None:
    """Nearest-rank percentiles of ``sample`` (None: empty)."""
    if not sample:
        return None
    ordered = sorted(sample)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p * len(ordered)) - 1)]

    return Latency(len(ordered), rank(0.5), rank(0.9), rank(0.99), ordered[-1])


def _empty(now: datetime, count: int, step: float) -> list[Bucket]:
    """The ``count`` buckets of ``step`` seconds before ``now``, with nothing in them,
    oldest first."""
    return [Bucket(now - timedelta(seconds=step * (k + 1)), now - timedelta(seconds=step * k))
            for k in range(count - 1, -1, -1)]


def _after(query: ArchiveQuery, last: MessageView) -> ArchiveQuery:
    return replace(query, after=last.key)


__all__ = ["LATENCY_SAMPLE", "WINDOWS", "ArchivePage", "Bucket", "ChannelOverview", "Insights",
           "Latency", "LivePage",
           "QueueDetail",
           "QueueOverview", "latency_of"]
