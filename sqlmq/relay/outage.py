"""The relay's log of its far broker's outages: one WARNING line when sends start failing,
one when one succeeds again, none between. A broker that is down for an hour while 100,000
messages wait would otherwise write a line per message per retry."""

from __future__ import annotations

import asyncio
import logging

from ..backoff import describe, unexpected

log = logging.getLogger("sqlmq.relay")


class Outage:
    """Whether the far broker is failing, and since when. A success counts as the end of an
    outage only if its send started after the outage's first failure: a confirmation that
    was already on its way when the broker went down ends nothing."""

    def __init__(self, what: str) -> None:
        self.what = what  # "relay orders -> RabbitMQ at amqp://…"
        #: Event loop time of the first failure of the current outage (None: no outage).
        self.since: float | None = None
        self.failures = 0
        #: Outages seen so far (a test, or an operator's metric, counts them).
        self.count = 0

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        if self.since is not None:
            return
        self.since = asyncio.get_running_loop().time()
        self.count += 1
        log.warning("%s: sending failed (%s); messages wait in the database and are retried "
                    "with backoff until it takes them again", self.what, describe(exc),
                    exc_info=exc if unexpected(exc) else None)

    def delivered(self, started: float) -> None:
        """A send that started at ``started`` (event loop time) was confirmed."""
        if self.since is None or started < self.since:
            return
        seconds = asyncio.get_running_loop().time() - self.since
        log.warning("%s: sending again after %.1f s, %d failed attempt(s)", self.what,
                    seconds, self.failures)
        self.since = None
        self.failures = 0


__all__ = ["Outage"]
