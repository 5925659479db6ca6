"""Signals nobody can read any more: the live workers' leader deletes the signals of
messages that ended, an hour after they were sent, a batch at a time, once a minute
(:meth:`~sqlmq.engines.contract.Engine.forget_ended_signals`).

A signal is kept until a wait reads it, and one may come before the wait, so a message
that ends without waiting leaves its signals behind; nothing else deletes them. The hour
keeps the signals of a message requeued from the archive meanwhile: a signal sent to it
since then may still be waited for. Errors back off and are logged; the loop runs until
the broker stops.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from .duty import LeaderDuty

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..engines.contract import Engine

log = logging.getLogger("sqlmq")


class SignalSweeper(LeaderDuty):
    """Forgets the signals of ended messages every ``EVERY`` seconds while ``leading()``
    says this process leads the live workers."""

    WHAT = "forgetting the signals of ended messages"
    TASK = "signal-sweep"
    #: How long ago a signal must have been sent.
    AGE = timedelta(hours=1)
    BATCH = 1000
    #: Seconds between two passes.
    EVERY = 60.0

    def __init__(self, engine: Engine, leading: Callable[[], bool]) -> None:
        super().__init__(leading)
        self.engine = engine
        #: Messages whose signals were deleted since the start.
        self.forgotten = 0

    def interval(self) -> float:
        return self.EVERY

    async def run_pass(self) -> int:
        """Forget ended messages' signals, batch after batch, while this process leads."""
        before = await self.engine.now() - self.AGE
        total = 0
        while self.leading():
            n = await self.engine.forget_ended_signals(before, self.BATCH)
            total += n
            self.forgotten += n
            if n < self.BATCH:
                break
        if total:
            log.info("forgot the signals of %d ended message(s)", total)
        return total


__all__ = ["SignalSweeper"]
