"""Acknowledging what Spark has committed: sequence ``n`` is archived COMPLETED (the engine's
fenced settle, through the ledger) once Spark calls ``latestOffset(start=n)`` or
``commit(n)``, on the background thread, so that Spark runs the next batch meanwhile."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from ..engines.spark import SparkLedger
from .faults import fault
from .options import StreamOptions
from .ownership import ConsumerBusy, Ownership

log = logging.getLogger("sqlmq.spark")


class Acknowledgements:
    """Acknowledgements of one consumer, in order, on the ``background`` thread it shares
    with the leases ahead."""

    def __init__(self, options: StreamOptions, ledger: SparkLedger, owner: Ownership,
                 background: ThreadPoolExecutor) -> None:
        self.o = options
        self.ledger = ledger
        self.owner = owner
        self._background = background
        self._pending: list[Future[None]] = []
        self._upto = -1  # the highest sequence handed to later()

    def acknowledge(self, upto: int) -> None:
        """Archive COMPLETED every message of sequences ``<= upto`` (committed by Spark).
        The archive, the lease rows and the sequence move in one transaction, so a crash
        leaves the sequence wholly acknowledged or not at all (and the restarted query
        acknowledges it again: Spark committed it)."""
        self.owner.check()
        held, landed = self.ledger.acknowledge(self.o.consumer, upto)
        fault("ack:committed")
        if landed < held:
            log.warning("sqlmq stream %s: %d of %d committed messages had lost their lease "
                        "(delivered again elsewhere)", self.o.consumer, held - landed, held)

    def later(self, upto: int) -> None:
        """:meth:`acknowledge` on the background thread, after whatever it is doing. A
        failed acknowledgement is retried by the next one, which covers every sequence up
        to its own."""
        if upto > self._upto:
            self._upto = upto
            self._pending.append(self._background.submit(self.acknowledge, upto))

    def wait(self, block: bool = True) -> None:
        """Wait for (or, without ``block``, collect the finished) background
        acknowledgements; raise :class:`ConsumerBusy` if one found the name taken."""
        pending = []
        for f in self._pending:
            if not block and not f.done():
                pending.append(f)
                continue
            try:
                f.result()
            except ConsumerBusy:
                raise
            except Exception as exc:
                self._upto = -1  # so that even an idle query's next call retries it
                log.warning("sqlmq stream %s: acknowledging failed (retried with the next "
                            "call): %s", self.o.consumer, exc)
        self._pending = pending
