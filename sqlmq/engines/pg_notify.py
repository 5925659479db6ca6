"""PostgreSQL wake-ups: publishing sends ``NOTIFY``, subscribers ``LISTEN`` and fetch at once
(the engine's :meth:`~sqlmq.engines.postgres.PostgresEngine.wake_source`).

A notification carries only the queue's name, never message content, and is sent by the
publishing statement itself, so it fires when that transaction commits (on sqlmq's
connection or the caller's) and not at all on rollback. PostgreSQL folds identical
notifications of one transaction into one.

Notifications are a shortcut, not a guarantee: one can be missed while the listening
connection is down, so subscribers keep polling as the safety net, and every (re)connect
wakes them all once to pick up whatever was published in the gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from ..backoff import Backoff
from ..schema import Schema
from ..tasks import cancel_and_wait
from .pg_errors import connection_lost

log = logging.getLogger("sqlmq")

#: How often an idle listening connection proves it is still alive.
HEALTH_INTERVAL = 10.0


def channel_for(schema: Schema) -> str:
    """The NOTIFY channel of one table prefix: brokers on other prefixes never wake."""
    return f"{schema.prefix}queue"


class Listener:
    """One dedicated connection per broker that LISTENs on the prefix's channel.

    ``on_queue(name)`` is called for each notification; ``on_connect()`` after every
    (re)connect. The connection comes from the broker's engine (so its URL, SSL and pool
    settings apply) and is closed, never returned to the pool, when the listener stops or
    fails: a pooled connection must not keep listening for someone else.
    """

    def __init__(self, db: AsyncEngine, channel: str, on_queue: Callable[[str], None],
                 on_connect: Callable[[], None]) -> None:
        self.db = db
        self.channel = channel
        self.on_queue = on_queue
        self.on_connect = on_connect
        self.connected = asyncio.Event()
        self.backend_pid: int | None = None
        self.connects = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"sqlmq-listen {self.channel}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self.connected.clear()

    async def _run(self) -> None:
        backoff = Backoff(f"LISTEN on {self.channel}", base=0.1, cap=10.0)
        while True:
            try:
                await self._listen_once(backoff)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.connected.clear()
                if connection_lost(exc):  # e.g. the pool's pre-ping on a killed backend:
                    # an ordinary disconnection, one warning line without asyncpg's
                    # internal state text or a traceback
                    exc = ConnectionError(f"the listening connection was lost "
                                          f"({type(exc).__name__})")
                await backoff.failed(exc)

    async def _listen_once(self, backoff: Backoff) -> None:
        conn = await self.db.connect()
        lost = asyncio.Event()
        driver: Any = None
        try:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            driver.add_termination_listener(lambda _c: lost.set())
            await driver.add_listener(self.channel, self._notified)
            self.backend_pid = driver.get_server_pid()
            self.connects += 1
            self.connected.set()
            backoff.succeeded()
            self.on_connect()  # anything published while we were not listening
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), HEALTH_INTERVAL)
                if lost.is_set() or driver.is_closed():
                    raise ConnectionError("the listening connection was closed")
                await asyncio.wait_for(driver.fetchval("SELECT 1"), HEALTH_INTERVAL)
        finally:
            self.connected.clear()
            with contextlib.suppress(Exception):
                await conn.invalidate()
            with contextlib.suppress(Exception):
                await conn.close()

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.on_queue(payload)
