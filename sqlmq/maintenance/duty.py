"""A duty one process does for all: a pass every so often while this process leads the
live workers (see :mod:`sqlmq.maintenance.heartbeat`); the others' wait. Errors back off
and are logged, with the traceback when they are not a database's; the loop runs until the
broker stops, and one that ends otherwise is logged with its traceback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..backoff import Backoff
from ..tasks import cancel_and_wait

log = logging.getLogger("sqlmq")


class LeaderDuty:
    """Runs :meth:`run_pass` every :meth:`interval` seconds while ``leading()``."""

    #: Names the log lines ("the archive's retention"), and the task (``sqlmq-TASK``).
    WHAT = "a leader's duty"
    TASK = "duty"

    def __init__(self, leading: Callable[[], bool]) -> None:
        self.leading = leading
        self._task: asyncio.Task[None] | None = None

    async def run_pass(self) -> int:
        raise NotImplementedError

    def interval(self) -> float:
        raise NotImplementedError

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"sqlmq-{self.TASK}")
            self._task.add_done_callback(self._ended)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        backoff = Backoff(self.WHAT)
        while True:
            if self.leading():
                try:
                    await self.run_pass()
                except Exception as exc:
                    await backoff.failed(exc)
                    continue
                backoff.succeeded()
            await asyncio.sleep(self.interval())

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._task is None:
            return
        exc = task.exception()
        log.error("%s stopped: %s", self.WHAT, "ended" if exc is None else exc, exc_info=exc)


__all__ = ["LeaderDuty"]
