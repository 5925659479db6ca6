"""Wake-ups of overlapping publishes on PostgreSQL: one NOTIFY after their commits instead of
one inside each.

PostgreSQL serialises the commits of transactions that sent a NOTIFY: each takes the
notification queue's lock before writing its commit record and keeps it through the WAL
flush, so such commits cannot share a flush (group commit) with one another. Measured here
(16 connections, one INSERT per transaction, 5 s each): 16,000-23,000 commits/s without the
NOTIFY, 5,500-5,900 with it. Under ``bench.run held``'s load (two publishing processes at
1,000 msg/s each, a transaction held open meanwhile) the publish call took 20-25 ms (p50)
with the NOTIFY in every publish and 0.5 ms without, the publishers queueing for that lock.

So a publish on sqlmq's own connection sends the NOTIFY in its own statement only while no
other publish of the engine doing so is under way: a lone publish wakes subscribers as
before, with no round trip more. A publish that overlaps one goes without (INSERT_QUIET) and,
once committed, asks :class:`PublishWakes` for a wake-up: one statement (WAKE) in a
transaction of its own naming every queue asked for since the last one was sent, and sent
again for those asked for while it was under way. A process thus has at most two notifying
transactions under way, whatever its publishing concurrency.

The WAKE goes out like any hot-path statement, on a kept connection: when publishes keep
every one busy, it waits its turn among them, first come first served (see
:mod:`..sql.kept_connections`).

A wake-up that fails is logged (once per run of failures) and dropped: the messages are
committed, and subscribers find them by polling, as after any missed notification. The
outbox (a publish in the caller's transaction) keeps the NOTIFY in its statement: sqlmq does
not see that commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ...backoff import describe, unexpected
from ...tasks import cancel_and_wait

log = logging.getLogger("sqlmq")

#: How long closing waits for the last wake-up to be sent before giving up on it.
CLOSE_PATIENCE = 5.0


class PublishWakes:
    """One engine's notifying publishes under way, and the wake-ups owed to quiet ones.
    Plain state on the event loop."""

    def __init__(self, send: Callable[[list[str]], Awaitable[object]]) -> None:
        self._send = send  # WAKE for these queues
        self._notifying = 0  # publishes under way with the NOTIFY in their own statement
        self._owed: set[str] = set()  # queues of quiet publishes not yet woken
        self._task: asyncio.Task[None] | None = None
        self._failures = 0  # wake-ups failed since the last one that was sent
        self.sent = 0  # WAKE statements sent (for tests and benchmarks)

    def claim(self) -> bool:
        """Whether a publish starting now should notify in its own statement; if so, it
        must call :meth:`release` when it ends, whatever the outcome."""
        if self._notifying:
            return False
        self._notifying += 1
        return True

    def release(self) -> None:
        self._notifying -= 1

    def wake(self, queue: str) -> None:
        """A quiet publish to ``queue`` committed: notify its listeners soon, after every
        WAKE already under way (which may have been sent before that commit)."""
        self._owed.add(queue)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="sqlmq wake-ups of overlapping publishes")

    async def _run(self) -> None:
        try:
            while self._owed:
                queues = sorted(self._owed)
                self._owed.clear()
                try:
                    await self._send(queues)
                except Exception as exc:  # not a cancellation: close() gives up that way
                    if not self._failures:
                        log.warning(
                            "the NOTIFY waking subscribers of %s failed (%s); they find the "
                            "messages by polling", ", ".join(map(repr, queues)),
                            describe(exc), exc_info=exc if unexpected(exc) else None)
                    self._failures += 1
                else:
                    self.sent += 1
                    if self._failures:
                        log.warning("the NOTIFY of overlapping publishes works again, after "
                                    "%d failed", self._failures)
                        self._failures = 0
        finally:
            self._task = None

    async def close(self) -> None:
        """Send the wake-ups still owed (within :data:`CLOSE_PATIENCE`), before the engine
        lets its connections go."""
        task = self._task
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), CLOSE_PATIENCE)
        except TimeoutError:
            log.warning("closing: gave up on the NOTIFY of overlapping publishes after %.0f s;"
                        " their subscribers find them by polling", CLOSE_PATIENCE)
            await cancel_and_wait(task)
