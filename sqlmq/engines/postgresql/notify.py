"""PostgreSQL wake-ups: publishing sends ``NOTIFY``, subscribers ``LISTEN`` and fetch at once
(the engine's :meth:`~.engine.PostgresEngine.wake_source`); endings a caller may wait for
(``Broker.result``: :class:`AnswerListener`, payload the ids, sent by the transaction that
ended them); and dead letters:
every message archived FAILED or CANCELLED sends one ``NOTIFY`` on a channel of its own,
which ``sqlmq dlq watch`` follows (:class:`DeadLetterListener`, the engine's
:meth:`~sqlmq.engines.postgresql.engine.PostgresEngine.dead_letter_source`).

A notification carries only the queue's name, never message content, and is sent by the
publishing statement itself, so it fires when that transaction commits (on sqlmq's
connection or the caller's) and not at all on rollback. PostgreSQL folds identical
notifications of one transaction into one.

Notifications are a shortcut, not a guarantee: one can be missed while the listening
connection is down, so subscribers keep polling as the safety net, and every (re)connect
wakes them all once to pick up whatever was published in the gap.

A dead letter's notification is sent by the statement that archives it (the settle of a
FAILED result, the archiving of a cancelled message), so it too is delivered when that
transaction commits, never on rollback, and never for a stale result (which writes nothing).
Its payload is small JSON text, ``{"id": 7, "queue": "orders", "state": "FAILED"}``, never
the message's body; a message deleted instead of archived (a subscriber's ``archive=``)
notifies too: it is a dead letter, only not kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from ...backoff import Backoff
from ...dead_letters import DeadLetterNotice
from ...schema import MAX_QUEUE_NAME, Schema
from ...tasks import cancel_and_wait
from .errors import connection_lost

log = logging.getLogger("sqlmq")

#: How often an idle listening connection proves it is still alive.
HEALTH_INTERVAL = 10.0


#: PostgreSQL refuses a notification whose payload is 8000 bytes or more.
NOTIFY_PAYLOAD_LIMIT = 8000

#: The longest dead-letter payload, in bytes: ``json_build_object`` writes a control
#: character of the queue's name as ``\u00XX`` (6 bytes), any other as itself (at most 4
#: bytes of UTF-8), and a queue name has at most MAX_QUEUE_NAME characters. The rest is
#: the keys, the longest id and the longest state.
DEAD_LETTER_PAYLOAD_MOST = len('{"id" : -9223372036854775808, "queue" : "", '
                               '"state" : "CANCELLED"}') + 6 * MAX_QUEUE_NAME
assert DEAD_LETTER_PAYLOAD_MOST < NOTIFY_PAYLOAD_LIMIT, "a dead letter's NOTIFY could fail"


def channel_for(schema: Schema) -> str:
    """The NOTIFY channel of one table prefix: brokers on other prefixes never wake."""
    return f"{schema.prefix}queue"


def dead_letter_channel(schema: Schema) -> str:
    """The NOTIFY channel of one table prefix's dead letters (at most 42 characters, within
    PostgreSQL's 63 for an identifier: a prefix has at most 30)."""
    return f"{schema.prefix}dead_message"


def result_channel(schema: Schema) -> str:
    """The NOTIFY channel of one table prefix's endings that callers may wait for (see
    :mod:`sqlmq.results`): at most 36 characters."""
    return f"{schema.prefix}result"


#: The longest payload of a result notification: the ids of messages that ended, separated
#: by commas; a settle that ends more sends several.
RESULT_PAYLOAD_MOST = 7900
assert RESULT_PAYLOAD_MOST < NOTIFY_PAYLOAD_LIMIT


def result_payloads(ids: list[int]) -> list[str]:
    """The payloads that announce ``ids``, each within :data:`RESULT_PAYLOAD_MOST`."""
    payloads: list[str] = []
    current = ""
    for msg_id in ids:
        text = str(msg_id)
        if current and len(current) + 1 + len(text) > RESULT_PAYLOAD_MOST:
            payloads.append(current)
            current = ""
        current = f"{current},{text}" if current else text
    if current:
        payloads.append(current)
    return payloads


def dead_letter_notice(payload: str) -> DeadLetterNotice:
    """A dead letter's notification payload (see the module's notes) as a notice; ValueError
    if it is not one."""
    try:
        found = json.loads(payload)
        notice = DeadLetterNotice(int(found["id"]), str(found["queue"]), str(found["state"]))
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"not a dead letter's notification: {payload[:200]!r}") from exc
    return notice


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

    async def listening(self) -> None:
        await self.connected.wait()

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


class DeadLetterListener(Listener):
    """The LISTEN connection on a prefix's dead-letter channel: ``on_dead(notice)`` for each
    notification, ``on_connect()`` after every (re)connect (a notification sent while the
    connection was down is lost: look at the archive then). A payload that is not a dead
    letter's, or a callback that raises, is logged and the listener goes on; a lost
    connection is logged once and reconnected with backoff, as for wake-ups."""

    def __init__(self, db: AsyncEngine, channel: str,
                 on_dead: Callable[[DeadLetterNotice], None],
                 on_connect: Callable[[], None]) -> None:
        super().__init__(db, channel, self._payload, on_connect)
        self.on_dead = on_dead

    def _payload(self, payload: str) -> None:
        try:
            self.on_dead(dead_letter_notice(payload))
        except Exception:
            log.exception("a dead-letter notification on %s could not be handled", self.channel)


class AnswerListener(Listener):
    """The LISTEN connection on a prefix's result channel (see :func:`result_channel`):
    ``on_ended(ids)`` for each notification, ``on_connect()`` after every (re)connect (a
    notification sent while it was down is lost: the waiters read again then). A payload
    that is not a list of ids is logged and skipped."""

    def __init__(self, db: AsyncEngine, channel: str, on_ended: Callable[[list[int]], None],
                 on_connect: Callable[[], None]) -> None:
        super().__init__(db, channel, self._payload, on_connect)
        self.on_ended = on_ended

    def _payload(self, payload: str) -> None:
        try:
            ids = [int(part) for part in payload.split(",")]
        except ValueError:
            log.error("a result notification on %s is not a list of ids: %r", self.channel,
                      payload[:200])
            return
        self.on_ended(ids)
