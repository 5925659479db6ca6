"""The inbox: messages of a far broker (a RabbitMQ queue, a NATS JetStream stream, a Redis
stream) taken into a sqlmq queue exactly once.

::

    inbox = Inbox(broker, "orders", source="amqp://guest:guest@rabbit:5672/",
                  queue_name="orders")
    await inbox.run()                 # until cancelled; or broker.add_middleware(inbox)

Each batch goes: fetch up to ``batch`` messages (the far broker holds them unacknowledged),
publish them with a ledger row each in one database transaction (:mod:`.ledger`), commit,
and only then acknowledge them to the far broker. A crash anywhere before the
acknowledgement makes the far broker deliver them again; the ledger has their keys, so the
second time writes nothing and only acknowledges: each far message is in sqlmq once. Its key
(the far broker's id for it, or a header's value, see :class:`Inbox`) is also the sqlmq
message's ``dedup_key``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..backoff import Backoff, describe
from ..errors import ConfigurationError, PublishError
from ..schema import MAX_DEDUP_KEY
from ..subscriber import check_queue
from .ledger import Ledger, Written
from .source import FarMessage, Source, SourceOptions, open_source
from .urls import parse_broker_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from ..broker import Broker

log = logging.getLogger("sqlmq")

#: How long the ledger keeps a far message's key by default: a redelivery later than this
#: is taken again.
DEFAULT_RETENTION = timedelta(days=7)
#: Seconds between two prunings of the ledger by a running inbox.
PRUNE_EVERY = 600.0
#: Seconds a fetch waits for a first message before the inbox looks whether to stop.
FETCH_WAIT = 0.5


@dataclass
class InboxCounts:
    """What an inbox did since it started: far messages published into sqlmq, those the
    ledger had already (delivered again: acknowledged, nothing written), and those refused
    (no key, or not publishable: see :meth:`Inbox.run`)."""

    taken: int = 0
    duplicates: int = 0
    refused: int = 0


class Inbox:
    """Takes the messages of a far broker into sqlmq queue ``queue`` exactly once.

    ``source``: the far broker's URL, ``amqp://`` (RabbitMQ: ``queue_name`` is the queue to
    consume; the key is the AMQP ``message_id``), ``nats://`` (JetStream: ``stream``, and
    ``subject`` to filter it, read by the durable pull consumer ``group``; the key is the
    ``Nats-Msg-Id`` header, else the stream sequence) or ``redis://`` (``stream`` read by the
    consumer group ``group`` as ``consumer``; the key is the entry id). ``group`` defaults to
    ``sqlmq-<queue>``. ``key_header``: take each message's key from this header (a Redis
    field) instead. A message without a key is refused (RabbitMQ: rejected to its
    dead-letter exchange; JetStream: terminated) unless ``require_key`` is false, when it is
    taken without a ledger row: at least once, not exactly once.

    ``name``: the source's name in the ledger (default: where it reads, such as
    ``rabbitmq:orders``); two inboxes with one name share their keys, so name one anew only
    to start over. ``retention``: how long the ledger keeps a key (a far message delivered
    again later than that is taken again). ``channel``: the sqlmq channel the messages are
    published to. ``batch``: messages per transaction; ``prefetch``: how many the far
    broker may hand over unacknowledged (default twice ``batch``). ``claim_idle``: seconds
    after which a Redis entry pending with a dead consumer is claimed.

    The broker must run on a database: the ledger is a table of it (``memory://`` has
    none, and is refused).
    """

    def __init__(
        self, broker: Broker, queue: str, *, source: str, queue_name: str | None = None,
        stream: str | None = None, subject: str | None = None, group: str | None = None,
        consumer: str | None = None, key_header: str | None = None, name: str | None = None,
        channel: str | None = None, batch: int = 500, prefetch: int | None = None,
        retention: timedelta | float = DEFAULT_RETENTION, claim_idle: float = 60.0,
        require_key: bool = True, connect_timeout: float = 10.0,
    ) -> None:
        self.broker = broker
        self.queue = check_queue(queue)
        self.url = parse_broker_url(source)
        self.batch = _in_range("batch", batch, 1, 10_000)
        self.retention = inbox_retention(retention)
        self.channel = channel
        self.require_key = require_key
        self.name = name
        try:
            self._db = broker.db
        except ConfigurationError:
            raise ConfigurationError(
                f"the inbox needs a database for its ledger of the far messages taken; the "
                f"broker on {broker.url} keeps its messages in the process: use a "
                "PostgreSQL, MySQL/MariaDB or SQLite URL") from None
        self.options = SourceOptions(
            queue_name=queue_name, stream=stream, subject=subject,
            group=group or "sqlmq-" + "".join(c if c.isalnum() or c in "-_" else "_"
                                              for c in self.queue),
            consumer=consumer, key_header=key_header,
            prefetch=_in_range("prefetch", prefetch or 2 * self.batch, 1, 65_535),
            claim_idle=claim_idle, connect_timeout=connect_timeout)
        self.source: Source = open_source(self.url, self.options)  # checks the options
        self.counts = InboxCounts()
        self.ledger: Ledger | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"Inbox({self.source.shown} -> {self.queue!r})"

    # ---- running -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None, *, idle: float | None = None) -> None:
        """Take messages until cancelled, :meth:`stop` is called or ``stop`` is set (or,
        with ``idle``, until no message came for that many seconds). A graceful stop
        finishes the batch in hand: committed and acknowledged. The far broker must be
        there at the start (:class:`~sqlmq.relay.source.SourceUnavailable` otherwise);
        later faults of either side are retried with backoff, logged once per incident."""
        self._stop.clear()
        await self._open()
        await self._serve([self._stop] + ([stop] if stop is not None else []), idle)

    async def drain(self, idle: float = 1.0) -> InboxCounts:
        """Take messages until none came for ``idle`` seconds; what it did."""
        await self.run(idle=idle)
        return self.counts

    async def start(self) -> None:
        """Run in a task of its own until :meth:`stop`; returns once the database and the
        far broker were reached, raising what stopped the start."""
        self._stop.clear()
        await self._open()
        self._task = asyncio.create_task(self._serve_logged())

    async def _serve_logged(self) -> None:
        try:
            await self._serve([self._stop], None)
        except Exception:
            log.exception("inbox from %s stopped by an error", self.source.shown)

    async def _open(self) -> None:
        await self.broker.check_schema()
        source_name = await self.source.open()
        self.ledger = Ledger(self._db, self.broker.schema, self.name or source_name,
                             self.retention)
        log.info("inbox from %s into queue %r started (ledger source %r)", self.source.shown,
                 self.queue, self.ledger.source)

    async def _serve(self, stopping: list[asyncio.Event], idle: float | None) -> None:
        pruner = asyncio.create_task(self._prune_now_and_then())
        try:
            await self._loop(stopping, idle)
        finally:
            pruner.cancel()
            await self.source.close()
            c = self.counts
            log.info("inbox from %s into queue %r stopped: %d taken, %d delivered again, %d "
                     "refused", self.source.shown, self.queue, c.taken, c.duplicates, c.refused)

    async def stop(self) -> None:
        """Stop gracefully: the batch in hand is committed and acknowledged first."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def broker_started(self, broker: Any) -> None:
        """With ``broker.add_middleware(inbox)``, the inbox runs while the broker does."""
        await self.start()

    async def broker_stopped(self, broker: Any) -> None:
        await self.stop()

    # ---- the loop ------------------------------------------------------------------------

    async def _loop(self, stopping: list[asyncio.Event], idle: float | None) -> None:
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        faults = Backoff(f"inbox from {self.source.shown}")
        while not any(e.is_set() for e in stopping):
            try:
                got = await self.source.fetch(self.batch, FETCH_WAIT)
                if got:
                    await self._take(got, stopping)
                faults.succeeded()
            except _Stopped:
                return  # the batch in hand unacknowledged: the far broker delivers it again
            except Exception as exc:
                await faults.failed(exc)
                await self._reopen(faults, stopping)
                continue
            if got:
                quiet_since = loop.time()
            elif idle is not None and loop.time() - quiet_since >= idle:
                return

    async def _reopen(self, faults: Backoff, stopping: list[asyncio.Event]) -> None:
        """After a fault of the far broker's connection: its unacknowledged messages will be
        delivered again (and found in the ledger); connect anew, with backoff."""
        await self.source.close()
        while not any(e.is_set() for e in stopping):
            try:
                await self.source.open()
                return
            except Exception as exc:
                await faults.failed(exc)

    async def _take(self, got: list[FarMessage], stopping: list[asyncio.Event]) -> None:
        keyed, keyless = [], []
        for m in got:
            if m.key is not None:
                m.key = fitted_key(m.key)
                keyed.append(m)
            elif self.require_key:
                await self._refuse(m, "it has no key (no message id, and no "
                                      f"{self.options.key_header or 'key'} header)")
            else:
                keyless.append(m)
        if keyed:
            await self._write(keyed, stopping)
        for m in keyless:
            await self._database(lambda m=m: self._publish_alone(m), stopping)
        self.counts.taken += len(keyless)
        await self.source.ack([*keyed, *keyless])

    async def _write(self, keyed: list[FarMessage], stopping: list[asyncio.Event]) -> None:
        assert self.ledger is not None
        try:
            written = await self._database(lambda: self.ledger.write(keyed, self._publish),
                                           stopping)
        except PublishError:  # one of them cannot be published: find it, take the others
            for m in list(keyed):
                try:
                    written = await self._database(
                        lambda m=m: self.ledger.write([m], self._publish), stopping)
                except PublishError as exc:
                    await self._refuse(m, str(exc))
                    keyed.remove(m)
                    continue
                self._count(written)
            return
        self._count(written)

    def _count(self, written: Written) -> None:
        self.counts.taken += len(written.taken)
        self.counts.duplicates += len(written.duplicates)

    async def _database(self, work: Any, stopping: list[asyncio.Event]) -> Any:
        """``work()``, retried with backoff while the database fails; on a stop meanwhile,
        :class:`_Stopped` (nothing acknowledged: the far broker delivers it again)."""
        faults = Backoff(f"inbox into queue {self.queue!r} (database {self.broker.url})")
        while True:
            try:
                result = await work()
                faults.succeeded()
                return result
            except PublishError:
                raise
            except Exception as exc:
                if any(e.is_set() for e in stopping):
                    raise _Stopped from exc
                await faults.failed(exc)

    async def _publish(self, conn: AsyncConnection,
                       messages: Sequence[FarMessage]) -> list[int]:
        """``messages`` into the queue on ``conn``, in their order, each with its headers."""
        return await self.broker.publish_batch(
            self.queue, [m.body for m in messages], headers=[m.headers for m in messages],
            dedup_keys=[m.key for m in messages], channel=self.channel, connection=conn)

    async def _publish_alone(self, m: FarMessage) -> None:
        await self.broker.publish(self.queue, m.body, headers=m.headers, channel=self.channel)

    async def _refuse(self, m: FarMessage, reason: str) -> None:
        log.error("inbox from %s refused a message: %s", self.source.shown, reason)
        self.counts.refused += 1
        await self.source.refuse(m, reason)

    async def _prune_now_and_then(self) -> None:
        await asyncio.sleep(random.uniform(1.0, 60.0))
        while True:
            try:
                assert self.ledger is not None
                gone = await self.ledger.prune()
                if gone:
                    log.info("inbox ledger of %r: %d keys older than %s deleted",
                             self.ledger.source, gone, self.retention)
            except Exception as exc:
                log.warning("inbox ledger pruning failed (%s); next try in %gs",
                            describe(exc), PRUNE_EVERY)
            await asyncio.sleep(PRUNE_EVERY)


class _Stopped(Exception):
    """The inbox was told to stop while the database failed: the batch in hand is left
    unacknowledged."""


def fitted_key(key: str) -> str:
    """A key the ledger and ``dedup_key`` hold as it is, else its SHA-256 (longer than
    :data:`MAX_DEDUP_KEY` characters, or holding a NUL)."""
    if len(key) <= MAX_DEDUP_KEY and "\x00" not in key:
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _in_range(what: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigurationError(f"inbox {what} must be a whole number from {low} to {high}, "
                                 f"got {value!r}")
    return value


def inbox_retention(value: timedelta | float) -> timedelta:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = timedelta(seconds=value)
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ConfigurationError(f"inbox retention must be a positive timedelta (or seconds), "
                                 f"got {value!r}")
    return value


__all__ = ["DEFAULT_RETENTION", "Inbox", "InboxCounts", "fitted_key", "inbox_retention"]
