"""What a live message waits on, as an operator asks it ("which of these are only delayed,
which did their handler defer, which wait for a signal?"), and a page of a queue's live
messages filtered by it.

Every engine tells it from the message's row alone, the first rule that applies winning:

- ``cancelling``: a cancellation was asked for while it ran (``cancel_requested``); it ends
  CANCELLED unless its handler succeeds.
- ``running``: PROCESSING, a delivery holds it.
- ``steps``: WAITING, a workflow's step whose dependencies have not all ended.
- ``signal``: its handler deferred it until a signal comes (``msg.wait_for``), and neither
  the signal nor its time has come.
- ``deferred``: its handler deferred it (its last history entry is the ``deferred`` one),
  and the time the defer asked for has not come.
- ``delayed``: due later for another reason: published with a delay or for a moment, or a
  retry waiting out its backoff.
- ``ready``: due: the next acquire of its queue may take it (unless the queue is paused or
  its channel's limits hold it back).

"Due" is ``next_attempt_at``, or ``channel_due_at`` for a channel's message, compared with
the database clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Wait(StrEnum):
    """What a live message waits on (see the module for the rules)."""

    READY = "ready"
    DELAYED = "delayed"
    DEFERRED = "deferred"
    SIGNAL = "signal"
    STEPS = "steps"
    CANCELLING = "cancelling"
    RUNNING = "running"


@dataclass(frozen=True, slots=True)
class LiveQuery:
    """A page of ``queue``'s live messages, oldest id first, those waiting on any of
    ``waits`` (None: every one). ``after`` is the id of the previous page's last row
    (keyset pagination, as :class:`~sqlmq.views.ArchiveQuery`'s)."""

    queue: str
    waits: tuple[Wait, ...] | None = None
    after: int | None = None
    limit: int = 50

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= 10_000:
            raise ValueError(f"a page of live messages holds 1 to 10000 rows, got {self.limit}")
        for wait in self.waits or ():
            if wait not in set(Wait):
                raise ValueError(f"a live message waits on none of {wait!r} (waits: "
                                 f"{', '.join(Wait)})")


__all__ = ["LiveQuery", "Wait"]
