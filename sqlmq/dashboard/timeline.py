"""A message's deliveries as a timeline: one row per delivery (when it was taken, by which
worker, when and how it ended, how long it took), drawn against the message's life from its
creation to its archiving (or now), as the message page shows them.

What sqlmq records decides what a row can say. Every ending but a success appends a
history entry with its time (``at``, on the database clock); a success writes none, the
archive's time is its ending. When a delivery was taken is on the row for the first
delivery (``first_attempt_at``) and the running one (``acquired_at``); an entry may carry
it (``taken``) and the worker (``worker``), and the row shows them when it does. A requeue
starts the deliveries again from 1 and keeps the history: the first row after one says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..views import MessageView

#: The narrowest bar drawn, in percent of the timeline's width (an instant stays visible).
MIN_WIDTH = 0.6


@dataclass(frozen=True, slots=True)
class Attempt:
    """One delivery of the message and how it ended (``ended``: the history's word, or
    ``completed`` or ``running``)."""

    delivery: int
    ended: str
    taken_at: datetime | None
    settled_at: datetime | None
    worker: str | None = None
    error: str = ""
    #: The first delivery after a requeue (the count starts again).
    requeued: bool = False
    #: Where its bar starts and how wide it is, in percent of the timeline.
    x: float = 0.0
    width: float = MIN_WIDTH

    @property
    def seconds(self) -> float | None:
        """From taken to ended (None: one of them is not recorded)."""
        if self.taken_at is None or self.settled_at is None:
            return None
        return max(0.0, (self.settled_at - self.taken_at).total_seconds())

    @property
    def outcome(self) -> str:
        """The class of its bar: ok, retried, failed, deferred, lost, running or other."""
        return _OUTCOMES.get(self.ended, "other")


_OUTCOMES = {"completed": "ok", "error": "retried", "nacked": "retried", "failed": "failed",
             "rejected": "failed", "expired": "failed", "cancelled": "failed",
             "deferred": "deferred", "lease_expired": "lost", "released": "lost",
             "running": "running"}


@dataclass(frozen=True, slots=True)
class Timeline:
    """The attempts of one message between ``start`` (its creation) and ``end``."""

    attempts: list[Attempt]
    start: datetime
    end: datetime
    #: Whether any attempt knows its worker (the page shows the column only then).
    workers: bool


def timeline(view: MessageView, now: datetime) -> Timeline:
    """``view``'s deliveries, from its history and times (``now``: the database clock, the
    end of a live message's timeline)."""
    rows: list[dict[str, Any]] = []
    last: int | None = None  # the delivery of the entry before
    for entry in view.history:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("delivery"), int):
            continue  # a hand edit's entry: the history table shows it as it is
        delivery, ended = entry["delivery"], str(entry.get("ended") or "?")
        rows.append({"delivery": delivery, "ended": ended,
                     "settled_at": _moment(entry.get("at")),
                     "taken_at": _moment(entry.get("taken")),
                     "worker": None if entry.get("worker") is None else str(entry["worker"]),
                     "error": str(entry.get("error") or ""),
                     "requeued": _again(delivery, last, ended)})
        last = delivery
    ending = None
    if view.live and view.state == "PROCESSING":
        ending = {"ended": "running", "taken_at": view.acquired_at, "settled_at": None}
    elif not view.live and view.deliveries and (view.state == "COMPLETED"
                                                or last != view.deliveries):
        # a success leaves no entry (nor does a row archived by hand): the archive's time
        ending = {"ended": view.state.lower(), "settled_at": view.archived_at}
    if ending is not None:
        rows.append({"delivery": view.deliveries, **ending,
                     "requeued": _again(view.deliveries, last, "")})
    _first_taken(rows, view.first_attempt_at)
    moments = [t for r in rows for t in (r.get("taken_at"), r.get("settled_at")) if t]
    start = min([view.created_at, *moments])
    end = max([view.archived_at or now, *moments])
    attempts = [_placed(r, start, end, now) for r in rows]
    return Timeline(attempts, start, end, any(a.worker for a in attempts))


def _again(delivery: int, last: int | None, ended: str) -> bool:
    """Whether ``delivery`` starts the count again after ``last`` (a requeue did). A
    cancellation while it waited repeats the number of the delivery before it."""
    if last is None or delivery < 1:
        return False
    return delivery < last or (delivery == last and ended != "cancelled")


def _first_taken(rows: list[dict[str, Any]], first_attempt_at: datetime | None) -> None:
    """The first delivery since the last requeue was taken at ``first_attempt_at``."""
    if first_attempt_at is None:
        return
    since = max((i for i, r in enumerate(rows) if r.get("requeued")), default=0)
    for r in rows[since:]:
        if r["delivery"] == 1 and r.get("taken_at") is None:
            r["taken_at"] = first_attempt_at
            return


def _placed(r: dict[str, Any], start: datetime, end: datetime, now: datetime) -> Attempt:
    span = max((end - start).total_seconds(), 1e-6)
    taken, settled = r.get("taken_at"), r.get("settled_at")
    begin = taken or settled or now
    finish = settled or (now if r["ended"] == "running" else begin)
    x = min(100.0 - MIN_WIDTH, max(0.0, (begin - start).total_seconds() / span * 100))
    width = max(MIN_WIDTH, min(100.0 - x, (finish - begin).total_seconds() / span * 100))
    return Attempt(r["delivery"], r["ended"], taken, settled, r.get("worker"),
                   r.get("error", ""), bool(r.get("requeued")), round(x, 3), round(width, 3))


def _moment(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        found = datetime.fromisoformat(value)
    except ValueError:
        return None
    return found.replace(tzinfo=UTC) if found.tzinfo is None else found.astimezone(UTC)


__all__ = ["Attempt", "Timeline", "timeline"]
