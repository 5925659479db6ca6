"""Retention of the archive: a broker's cleaner deletes archived messages once they are
older than the ages it was given, COMPLETED ones (and EXPIRED) after one, the dead letters
(FAILED and CANCELLED) after another, so the archive stops growing without a cron job::

    broker = Broker(url, retention=Retention(completed=timedelta(days=7),
                                             failed=timedelta(days=30)))

One process does it for all: the leader of the live workers (see
:mod:`sqlmq.maintenance.heartbeat`), so a hundred workers do not scan the archive a
hundred times; the others' cleaners wait. It deletes in small batches (``batch`` rows, one
short transaction each, the oldest first, with a pause between them), so it never holds
locks long on a busy archive, and it goes back to waiting as soon as it stops leading.
Errors back off and are logged, with the traceback when they are not a database's; the
loop runs until the broker stops.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from ..errors import ConfigurationError
from ..lifecycle import State
from .duty import LeaderDuty

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..engines.contract import Engine

log = logging.getLogger("sqlmq")


@dataclass(frozen=True)
class Retention:
    """How long the archive keeps what (None: for ever). ``completed`` covers COMPLETED and
    EXPIRED messages, ``failed`` the dead letters, FAILED and CANCELLED. ``every``: seconds
    between two passes; ``batch``: rows per delete; ``pause``: seconds between batches."""

    completed: timedelta | None = None
    failed: timedelta | None = None
    every: float = 60.0
    batch: int = 1000
    pause: float = 0.05

    def __post_init__(self) -> None:
        for name in ("completed", "failed"):
            value = getattr(self, name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                object.__setattr__(self, name, value := timedelta(seconds=value))
            if value is not None and (not isinstance(value, timedelta)
                                      or value < timedelta(0)):
                raise ConfigurationError(f"retention {name} must be a timedelta (or seconds) "
                                         f"of zero or more, or None, got {value!r}")
        if not isinstance(self.batch, int) or not 1 <= self.batch <= 100_000:
            raise ConfigurationError(f"retention batch must be 1 to 100000 rows, got "
                                     f"{self.batch!r}")
        if not self.every > 0 or self.pause < 0:
            raise ConfigurationError("retention every must be above 0 and pause 0 or more")

    def rules(self) -> list[tuple[str, timedelta]]:
        """(state, age) for each archived state with an age."""
        ages = {State.COMPLETED: self.completed, State.EXPIRED: self.completed,
                State.FAILED: self.failed, State.CANCELLED: self.failed}
        return [(state.value, age) for state, age in ages.items() if age is not None]


class ArchiveCleaner(LeaderDuty):
    """Runs :class:`Retention`'s passes every ``retention.every`` seconds while
    ``leading()`` says this process leads."""

    WHAT = "the archive's retention"
    TASK = "retention"

    def __init__(self, engine: Engine, retention: Retention,
                 leading: Callable[[], bool]) -> None:
        super().__init__(leading)
        self.engine = engine
        self.retention = retention
        #: Rows deleted since the start, and passes run.
        self.deleted = 0
        self.passes = 0

    def interval(self) -> float:
        return self.retention.every

    async def run_pass(self) -> int:
        """One pass: delete what is past its age, batch after batch; how many. Stops early
        if this process no longer leads."""
        r = self.retention
        now = await self.engine.now()
        total = 0
        for state, age in r.rules():
            while self.leading():
                n = await self.engine.purge_archived(state=state, before=now - age,
                                                     limit=r.batch)
                total += n
                self.deleted += n  # as it goes: a pass cut short by an error counts its batches
                if n < r.batch:
                    break
                await asyncio.sleep(r.pause)
        self.passes += 1
        if total:
            log.info("retention: deleted %d archived message(s) past their age", total)
        return total


__all__ = ["ArchiveCleaner", "Retention"]
