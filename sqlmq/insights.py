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
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .records import QueueStats
from .views import ArchiveQuery, MessageView, WindowCount

if TYPE_CHECKING:
    from .channels import ChannelInfo
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

        One statement whatever the number of buckets: the activity of nested windows
        (``step``, ``2 * step``, ... ``span`` seconds back), differenced, so a chart of the
        last hour costs one read of the archive's last hour, as :meth:`queues` does."""
        count = round(span / step) if step > 0 else 0
        if not 1 <= count <= 120:
            raise ValueError(f"a throughput chart has 1 to 120 buckets, got {span}/{step}")
        now = await self.engine.now()
        windows = [step * k for k in range(1, count + 1)]
        found = {w.window: w for w in await self.engine.archive_activity(windows)
                 if w.queue == queue}
        cumulative = [found.get(w, WindowCount(queue, w)) for w in windows]
        buckets = []
        for k in range(count - 1, -1, -1):  # oldest first
            wide = cumulative[k]
            narrow = cumulative[k - 1] if k else WindowCount(queue, 0.0)
            buckets.append(Bucket(
                now - timedelta(seconds=windows[k]),
                now - timedelta(seconds=windows[k] - step),
                *(getattr(wide, f) - getattr(narrow, f) for f in _COUNTED)))
        return buckets

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

    async def archive(self, query: ArchiveQuery) -> ArchivePage:
        items = await self.engine.search_archive(query)
        more = len(items) == query.limit
        return ArchivePage(items, _after(query, items[-1]) if more else None)

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


def _after(query: ArchiveQuery, last: MessageView) -> ArchiveQuery:
    return replace(query, after=last.key)


__all__ = ["LATENCY_SAMPLE", "WINDOWS", "ArchivePage", "Bucket", "Insights", "Latency",
           "QueueDetail",
           "QueueOverview", "latency_of"]
