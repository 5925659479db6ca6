"""Recovery of expired leases: a message whose consumer died (or stalled past its lease)
goes back to PENDING, so that another delivery takes it. One loop per broker; the engines
make recoverers of many processes take turns."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..backoff import Backoff
from ..engines.contract import Engine
from ..tasks import cancel_and_wait

log = logging.getLogger("sqlmq")

#: Messages recovered per call; a full batch is followed at once by the next.
BATCH = 1000


class LeaseRecovery:
    """Calls ``engine.recover_expired`` every ``interval()`` seconds (read each round: a
    subscriber registered later may ask for a shorter one) and ``on_recovered()`` after a
    round that returned messages, so that idle subscribers look for them. Errors back off
    and are logged; the loop runs until :meth:`stop`."""

    def __init__(self, engine: Engine, interval: Callable[[], float], spread: float,
                 on_recovered: Callable[[], None]) -> None:
        self.engine = engine
        self.interval = interval
        self.spread = spread
        self.on_recovered = on_recovered
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sqlmq-recovery")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        backoff = Backoff("recovery of expired leases")
        while True:
            try:
                recovered = await self.engine.recover_expired(BATCH, self.spread)
            except Exception as exc:
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            if recovered:
                log.info("recovered %d message(s) whose lease expired", len(recovered))
                self.on_recovered()
                if len(recovered) == BATCH:
                    continue
            await asyncio.sleep(self.interval())
