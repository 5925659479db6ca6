"""The operators' half of the engine contract (:class:`~.contract.Engine` includes it):
the read-only views the insights layer is built on, the live workers registry and paused
queues. Nothing here is on the hot path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ...records import PausedQueue, Whereabouts, WorkerBeat, WorkerInfo
from ...views import ArchiveQuery, BucketCount, MessageView, WindowCount
from ...waits import LiveQuery


class OperationsContract(Protocol):
    """What the insights layer, the CLI and the live workers registry need of an engine."""

    # ---- read-only views (see sqlmq.views and sqlmq.insights) --------------------------------

    async def message_view(self, msg_id: int) -> MessageView | None:
        """Message ``msg_id`` as it is now, live or archived (None: no such message). A row
        whose headers or history are malformed still shows, with the raw text."""
        ...

    async def search_archive(self, query: ArchiveQuery) -> list[MessageView]:
        """A page of the archive matching ``query``, newest first (keyset-paginated)."""
        ...

    async def search_archive_text(self, words: Sequence[str], limit: int,
                                  before: int | None = None) -> list[MessageView]:
        """The archived messages each of whose ``words`` (lower case letters and digits,
        as :func:`sqlmq.search.words` gives them) begins a word of their header values or
        error (see :mod:`sqlmq.search`), newest first by id, at most ``limit`` of them,
        with ids below ``before`` if given. Read from the database's text index (schema
        version 26), not by reading the archive."""
        ...

    async def archive_activity(self, windows: Sequence[float]) -> list[WindowCount]:
        """Per queue and window (seconds back from the database clock): how many messages
        were archived in each final state, and how many of them took more than one
        delivery. Queues with nothing archived in the widest window are left out."""
        ...

    async def archive_buckets(self, span: float, step: float,
                              queue: str | None = None) -> list[BucketCount]:
        """Per queue (or ``queue`` only) and ``step``-second bucket of the last ``span``
        seconds on the database clock: how many messages were archived in each final
        state, and how many of them took more than one delivery (see
        :class:`~sqlmq.views.BucketCount` and :func:`~sqlmq.views.bucket_index` for which
        bucket a row is in). Buckets with nothing archived are left out. One statement
        whatever the number of queues and buckets: a chart of every queue costs one read
        of the archive's last ``span`` seconds."""
        ...

    async def latency_sample(self, queue: str, window: float, limit: int) -> list[float]:
        """Seconds from creation to archive of ``queue``'s latest (at most ``limit``)
        COMPLETED messages archived in the last ``window`` seconds."""
        ...

    async def delivery_counts(self, queue: str) -> dict[int, int]:
        """How many of ``queue``'s live messages have had each number of deliveries."""
        ...

    async def live_messages(self, query: LiveQuery) -> list[MessageView]:
        """A page of a queue's live messages (see :class:`~sqlmq.waits.LiveQuery`), each
        with what it waits on (``waits``, by the rules of :mod:`sqlmq.waits`, on the
        database clock)."""
        ...

    async def live_waits(self, queue: str) -> dict[str, int]:
        """How many of ``queue``'s live messages wait on each :class:`~sqlmq.waits.Wait`
        (the values waited on by none are left out)."""
        ...

    async def count_archive(self, query: ArchiveQuery, most: int | None = None) -> int:
        """How many archived messages pass ``query``'s filters (its page, ``after`` and
        ``limit``, plays no part), counting at most ``most`` (None: all), so that a page
        that shows the count of a search of a large archive stays cheap."""
        ...

    async def whereabouts(self, ids: Sequence[int]) -> dict[int, Whereabouts]:
        """The state and delivery count of each of ``ids``, from the message table or else
        the archive; an id in neither (deleted: its consumer group was, or a subscriber's
        ``archive=`` did not keep its ending) is left out. The runtime reads it for the
        results a settle left out, to log why each was dropped."""
        ...

    # ---- operations: live workers and paused queues (schema version 11) -----------------------

    async def heartbeat(self, beat: WorkerBeat) -> int:
        """Write a running broker's row of the workers registry (made by its first beat,
        which sets ``started_at``): its description and counts, ``heartbeat_at`` now and
        ``expires_at`` ``beat.ttl`` seconds on, both on the database clock. Then delete the
        rows whose ``expires_at`` has passed, and return how many: the rows of processes
        that died without stopping. Every live broker beats, so dead rows age out with no
        sweeper of their own; each row carries its own expiry, so brokers beating at
        different intervals judge each other by the writer's interval, not their own."""
        ...

    async def leave(self, worker_id: str) -> None:
        """Delete a broker's row of the workers registry (it stops)."""
        ...

    async def workers(self) -> list[WorkerInfo]:
        """The live workers (``expires_at`` still ahead on the database clock), by host,
        pid and start: a dead process's row is left out even before it is deleted."""
        ...

    async def pause(self, queue: str) -> bool:
        """Pause ``queue`` for every process: from the commit on, no acquire (plain or
        channel), no hand-over (:meth:`publish_leased`) and no Spark lease takes its
        messages, because each reads the pause in its own statement. False: it was paused
        already (nothing changes)."""
        ...

    async def resume(self, queue: str) -> bool:
        """Lift the pause of ``queue`` (waking consumers in other processes where the
        database can: NOTIFY on PostgreSQL). False: it was not paused."""
        ...

    async def paused(self) -> list[PausedQueue]:
        """The paused queues, by name."""
        ...


__all__ = ["OperationsContract"]
