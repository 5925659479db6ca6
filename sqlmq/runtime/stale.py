"""Why a result was dropped as stale, for its log line.

A settle writes a result only while the message's row is PROCESSING under that very
delivery; the results it leaves out are dropped. The settle cannot say why, and an operator
reading "its lease expired" after deleting a consumer group is misled: so the messages of
the results left out are looked up (``Engine.whereabouts``, one read, and only when some
were left out), and where each one is now tells what happened to it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..backoff import describe
from ..lifecycle import Archive, Settlement, State
from ..records import Whereabouts

if TYPE_CHECKING:
    from ..engines.contract import Engine

log = logging.getLogger("sqlmq")

_LIVE = frozenset({State.PENDING.value, State.PROCESSING.value, State.RETRYABLE.value})


async def log_stale(engine: Engine, dropped: Sequence[Settlement], archive: Archive) -> None:
    """Log a WARNING for each result of ``dropped``, saying why it did not apply. Never
    raises: the settle is done, and a failed look-up only leaves the reason unknown."""
    try:
        found = await engine.whereabouts([s.id for s in dropped])
    except Exception as exc:
        failed = f"why is unknown, its message could not be looked up ({describe(exc)})"
        reasons = [failed] * len(dropped)
    else:
        reasons = [stale_reason(s, found.get(s.id), archive) for s in dropped]
    for s, why in zip(dropped, reasons, strict=True):
        log.warning("dropped a stale result for message %d (delivery %d): %s", s.id,
                    s.deliveries, why)


def stale_reason(s: Settlement, where: Whereabouts | None, archive: Archive) -> str:
    """Why the settle left ``s`` out, from where its message is now (None: in neither the
    message table nor the archive). ``archive``: what the subscriber keeps, as a later
    delivery's ending that it does not keep leaves no row either."""
    if where is None:
        reason = ("the message was deleted while it ran (its consumer group was deleted, or "
                  "it was removed by hand)")
        if archive is not Archive.ALL:
            reason += (f", or a later delivery ended it and archive={archive.value!r} did "
                       "not keep it")
        return reason
    live = where.state in _LIVE
    if where.deliveries > s.deliveries:
        return ("its lease expired and it was delivered again" + (
            f" (delivery {where.deliveries})" if live
            else f", which ended it {where.state}"))
    if not live:
        return f"its lease expired and it was archived {where.state} before it ran again"
    if where.state != State.PROCESSING:
        return f"its lease expired and it went back to the queue ({where.state})"
    return "the database no longer had it PROCESSING under this delivery"
