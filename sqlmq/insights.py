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
from datetime import datetime
from typing import TYPE_CHECKING

from .records import QueueStats
from .views import ArchiveQuery, MessageView, WindowCount

if TYPE_CHECKING:
    from .channels import ChannelInfo
    from .engines.contract import Engine
    from .schedules import ScheduleInfo

#: The rate windows, in seconds, and how they are shown.
WINDOWS: dict[str, float] = {"1m": 60.0, "15m": 900.0, "1h": 3600.0}
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


__all__ = ["LATENCY_SAMPLE", "WINDOWS", "ArchivePage", "Insights", "Latency", "QueueDetail",
           "QueueOverview", "latency_of"]
