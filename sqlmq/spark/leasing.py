"""The lease sequences of one consumer: leasing the next batch (ahead, on the background
thread), reusing or releasing what a previous run left leased, and keeping leases alive.

A sequence is acquired and recorded in one transaction (the ledger's :meth:`take` inside
the one that checks ownership): a crash at any instant leaves its messages either untouched
or leased *and* recorded, which a restart reuses or releases, never acquired and recorded
nowhere, which would hold them PROCESSING until their lease expired.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..engines.spark import ACQUIRE_CHUNK, Lease, SparkLedger
from ..lifecycle import Outcome
from ..records import Settlement
from .faults import fault
from .options import StreamOptions
from .ownership import ConsumerBusy, Ownership

log = logging.getLogger("sqlmq.spark")

#: Seconds between two warnings that the stream's queue holds channel messages it never reads.
CHANNEL_NOTICE_EVERY = 60.0


class Leasing:
    """Sequences leased by this driver. ``run`` runs a coroutine of the broker's engine
    (settle, extend) to its end from this thread; ``background`` is the one thread leases
    ahead and acknowledgements share, so that they run one at a time, in order."""

    def __init__(self, options: StreamOptions, ledger: SparkLedger, owner: Ownership,
                 engine: Callable[[], Any], run: Callable[[Coroutine[Any, Any, Any]], Any],
                 background: ThreadPoolExecutor) -> None:
        self.o = options
        self.ledger = ledger
        self.owner = owner
        self._engine = engine
        self._run = run
        self._background = background
        self.ahead: Future[int] | None = None
        self._ahead_seq = 0
        # The leases of sequences just leased, by sequence, sorted like ledger.leases:
        # partitions() takes them instead of reading the lease rows back.
        self._fresh: dict[int, list[Lease]] = {}
        self._swept = False  # see release_unlogged
        self._channels_noticed: float | None = None  # see _notice_channel_messages

    def lease_ahead(self, last: int, limit: int) -> None:
        """Lease sequence ``last + 1`` in the background, so that the next ``latestOffset``
        finds it ready. Until Spark logs it, it is an ordinary orphan lease: renewed by the
        keeper and reused after a restart."""
        self._ahead_seq = last + 1
        self.ahead = self._background.submit(self._lease_fresh, last + 1, limit)

    def release_unlogged(self, start: int) -> None:
        """Once per run, at the first planning: give back the messages of sequences past
        ``start + 1``. Spark logs each offset it plans before it asks for the next one, so
        those sequences were leased ahead by a run that died before Spark logged the batch
        before them, and no replay will read them (``start + 1`` itself is reused by
        :meth:`lease_next`). Left alone they would sit PROCESSING until their lease
        expired, or be acknowledged with a later sequence without ever being read. Released
        without a refund: the delivery number moves on, so a lease row that survives a crash
        here can never match a later delivery."""
        if self._swept:
            return
        self.owner.check()
        with self.ledger.sql_engine.connect() as conn:
            stale = self.ledger.leases(conn, self.o.consumer, after=start + 1)
        released = 0
        for i in range(0, len(stale), 5000):
            released += len(self._run(self._engine().settle([
                Settlement(x, d, Outcome.RELEASE, attempted=False)
                for x, d, _ in stale[i : i + 5000]])))
            fault("sweep:released")
        if stale:
            with self.ledger.sql_engine.begin() as conn:
                self.ledger.drop_leases(conn, self.o.consumer, after=start + 1)
            fault("sweep:deleted")
            log.info("sqlmq stream %s: released %d messages a previous run had leased ahead "
                     "of Spark's offset log", self.o.consumer, released)
        self._swept = True

    def lease_next(self, start: int, limit: int | None) -> tuple[int, int]:
        """The end offset of the next batch and how many messages were newly acquired."""
        self.owner.check()
        nxt = start + 1
        if self.ahead is not None:
            ahead, self.ahead = self.ahead, None
            try:
                got = ahead.result()
            except Exception as exc:  # whatever it leased is an orphan, handled below
                log.warning("sqlmq stream %s: leasing ahead failed: %s", self.o.consumer, exc)
                got = 0
            if self._ahead_seq == nxt and got and limit != 0:
                return nxt, got
        if self._reuse_orphan(nxt):
            return nxt, 0
        if limit == 0:
            return start, 0
        got_n = self._lease_fresh(nxt, limit)
        return (nxt, got_n) if got_n else (start, 0)

    def _reuse_orphan(self, nxt: int) -> bool:
        """Sequence ``nxt`` leased before a crash but never logged by Spark: keep what is
        still ours (True), or drop its lease rows if nothing is (False)."""
        with self.ledger.sql_engine.connect() as conn:
            orphan = self.ledger.leases(conn, self.o.consumer, after=nxt - 1, upto=nxt)
        self._fresh.pop(nxt, None)  # an orphan is read back from the table
        if not orphan:
            return False
        kept = self._run(self._engine().extend([(x, d) for x, d, _ in orphan], self.o.lease))
        fault("reuse:extended")
        if kept and len(kept) == len(orphan):
            return True
        with self.ledger.sql_engine.begin() as conn:  # drop the rows of what was lost
            self.ledger.drop_leases(conn, self.o.consumer, after=nxt - 1, upto=nxt,
                                    keep=list(kept))
        return bool(kept)

    def _lease_fresh(self, nxt: int, limit: int | None) -> int:
        """Acquire up to ``limit`` messages and record them as sequence ``nxt``, in the
        transaction that checks ownership (the consumer row first, then the messages)."""
        cap = self.ledger.take_cap
        leased: list[Lease] = []
        with self.ledger.sql_engine.begin() as conn:
            if not self.ledger.own(conn, self.o.consumer, self.owner.token, nxt):
                raise ConsumerBusy(f"consumer {self.o.consumer!r} was taken over by another "
                                   "query while leasing")
            fault("lease:owned")
            while limit is None or len(leased) < limit:
                want = min(cap, ACQUIRE_CHUNK if limit is None else limit - len(leased))
                got = self.ledger.take(conn, self.o.queue, self.o.consumer, nxt, want,
                                       self.o.lease)
                leased += got
                if len(got) < want:
                    break
            fault("lease:recorded")
        fault("lease:committed")
        if leased:
            leased.sort()
            self._fresh[nxt] = leased
        else:
            self._notice_channel_messages()
        return len(leased)

    def _notice_channel_messages(self) -> None:
        """Warn, when a lease finds nothing (once a minute at most), that the queue holds
        messages published with a channel: the stream reads only those published without
        one, so these would wait, unseen, for a subscriber to start them."""
        now = time.monotonic()
        if self._channels_noticed is not None and now - self._channels_noticed < \
                CHANNEL_NOTICE_EVERY:
            return
        self._channels_noticed = now
        waiting = self.ledger.channel_waiting(self.o.queue)
        if waiting:
            log.warning(
                "sqlmq stream %s: queue %r holds %d message(s) published with a channel, "
                "which the Spark stream does not read (it would bypass the channel's "
                "limits); they wait for a subscriber of the queue (broker.subscriber) to "
                "start them", self.o.consumer, self.o.queue, waiting)

    def leased(self, start: int, end: int) -> list[Lease]:
        """The leases of sequences ``start + 1 .. end``, by id."""
        self.owner.check()
        if end == start + 1:
            # Usually leased on the background thread moments ago: no need to read it back.
            fresh = self._fresh.pop(end, None)
            if fresh is not None:
                return fresh
        with self.ledger.sql_engine.connect() as conn:
            return self.ledger.leases(conn, self.o.consumer, after=start, upto=end)

    def forget(self, upto: int) -> None:
        """Sequences ``<= upto`` are committed by Spark: never read again."""
        for seq in [k for k in list(self._fresh) if k <= upto]:
            self._fresh.pop(seq, None)

    def extend(self) -> None:
        """Push the lease of every message held (any sequence) to now + leaseSeconds."""
        with self.ledger.sql_engine.connect() as conn:
            held = self.ledger.leases(conn, self.o.consumer, after=0)
        for i in range(0, len(held), 5000):
            self._run(self._engine().extend(
                [(x, d) for x, d, _ in held[i : i + 5000]], self.o.lease))
