"""The engine contract: every operation on sqlmq's rows, named after the lifecycle.

The broker, the subscriber runtime, the maintenance duties and the edges (CLI, Spark) call
these methods and nothing else that touches a database; only the engine knows which
database it is. Each database's engine lives beside this file with its statements in
``sql/<database>.py``; ``memory.py`` implements the same contract in the process.

The Spark source and sink run without an event loop, in Spark's driver and executors; their
bookkeeping (leases recorded with the acquire, acknowledgements, staged publishes) is the
synchronous half of the contract: :class:`sqlmq.engines.spark.SparkLedger`, one per database,
chosen by :func:`sqlmq.engines.spark.ledger_for`.

Fencing: every write after acquisition is conditional on ``(id, deliveries)`` and state
PROCESSING. Methods that write after acquisition return the ids they actually wrote;
anything missing was stale (its lease expired and another delivery owns it now).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ...channels import ChannelInfo, ChannelSettings
from ...dead_letters import DeadLetterNotice
from ...lifecycle import State
from ...records import (
    Cancellation,
    Delivery,
    NewMessage,
    NewMessages,
    QueueStats,
    Settlement,
)
from ...schedules import Schedule, ScheduleInfo
from ...schema import Schema
from ...views import ArchiveQuery, MessageView
from .operations import OperationsContract
from .results import AnswerSource, ResultsContract
from .topics import TopicsContract
from .workflows import WorkflowsContract

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    from ..sql.drivers import AsyncDriverConnection, SyncDriverConnection

class WakeSource(Protocol):
    """A push notification of new messages (PostgreSQL's LISTEN), started by the broker."""

    def start(self) -> None: ...

    async def listening(self) -> None:
        """Return once notifications reach this source: a publish committed after that
        wakes the subscribers at once (the broker's ``start()`` waits for it, bounded)."""
        ...

    async def stop(self) -> None: ...


class DeadLetterSource(Protocol):
    """A push notice of every dead letter, whichever process archived it (PostgreSQL's
    LISTEN on :attr:`channel`), started and stopped by its user (``sqlmq dlq watch``).
    Notices sent while it is not connected are lost: its ``on_connect`` callback runs after
    every (re)connect, when the user looks at the archive for what it missed."""

    #: Where the notices come from (the NOTIFY channel), for the user's messages.
    channel: str

    def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class Engine(OperationsContract, ResultsContract, TopicsContract, WorkflowsContract,
             Protocol):
    """What the broker, the runtime and the edges need from a database."""

    schema: Schema
    #: Whether :meth:`publish_leased` exists: a publish handed straight to an idle local
    #: subscriber, already acquired (one round trip from publish to handler).
    hands_over: bool

    # ---- publishing ------------------------------------------------------------------------

    async def publish(
        self, messages: NewMessages,
        executor: AsyncConnection | AsyncSession | AsyncDriverConnection | None = None,
    ) -> list[int]:
        """Insert ``messages`` (ids returned in order; they share a queue, a schedule and a
        priority: one ``publish_batch``), on sqlmq's own connections or, with
        ``executor``, in the caller's transaction (SQLAlchemy's, or a driver's own
        connection: :mod:`.sql.drivers`). Wakes consumers in other processes where the
        database can (NOTIFY on PostgreSQL, sent at the caller's commit)."""
        ...

    def publish_sync(
        self, messages: NewMessages,
        executor: Connection | Session | SyncDriverConnection | None = None,
    ) -> list[int]:
        """The same, for code without an event loop."""
        ...

    async def publish_leased(self, message: NewMessage, lease: float) -> Delivery | None:
        """Insert ``message`` already acquired (its first delivery, leased for ``lease``
        seconds): the row an acquire would have left. Only where ``hands_over``. None, and
        nothing written, if its queue is paused: the hand-over is an acquire, and must not
        take what an acquire would not (the caller publishes it the ordinary way)."""
        ...

    # ---- periodic schedules (see :mod:`sqlmq.schedules`) ------------------------------------

    async def register_schedule(self, schedule: Schedule) -> ScheduleInfo:
        """Record ``schedule`` (made if new; with a changed cadence, it starts afresh: its
        ``registered_at`` becomes now) and return what the database knows of it."""
        ...

    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule, by name."""
        ...

    async def delete_schedule(self, name: str) -> bool:
        """Forget a schedule and its ticks; False if there was none."""
        ...

    async def pause_schedule(self, name: str, paused: bool) -> bool | None:
        """Pause schedule ``name`` (``paused``) or resume it, for every process: from the
        commit on, :meth:`fire_tick` publishes none of its ticks until it is resumed (it
        reads the pause under the row's lock), and :meth:`register_schedule` keeps the
        pause. True: done; False: it was so already; None: no such schedule."""
        ...

    async def fire_tick(self, name: str, tick: datetime,
                        produce: Callable[[], Awaitable[NewMessages]]) -> int | None:
        """Publish the message ``produce()`` makes for ``tick`` of schedule ``name``, unless
        the schedule has published this tick or a later one (or is gone, or paused): the
        message's id, else None. Processes take turns per schedule; ``produce`` runs only
        for a tick that is taken, and an error it raises publishes nothing."""
        ...

    # ---- consuming -------------------------------------------------------------------------

    async def acquire(self, queues: Sequence[str], limit: int, lease: float) -> list[Delivery]:
        """Mark up to ``limit`` ready messages PROCESSING (one more delivery each, a lease of
        ``lease`` seconds) and return them highest priority first, then in the order they
        became ready (then by id)."""
        ...

    def channel_start_in(self, queues: Sequence[str]) -> float | None:
        """Seconds until the soonest channel of ``queues`` that waits only for its rate (a
        message of its is due) may start again, as the last acquire of ``queues`` that
        found no channel to start saw it; None: there was none, or that acquire started
        one. A fetcher polls then rather than after its idle backoff, so that a rate is
        kept, not lost to polling delays."""
        ...

    async def settle(self, settlements: Sequence[Settlement]) -> set[int]:
        """Apply a batch of results in one transaction: archive, retry, release or defer
        (a defer of a message whose cancellation was asked for archives it CANCELLED); and
        publish the ``outputs`` of the settlements that land (a pipeline step's), keep the
        ``result`` of those that land COMPLETED on their archive rows and announce those
        with ``answers`` (``answer_source``), in that transaction (see
        :mod:`sqlmq.engines.sql.settle_onward`)."""
        ...

    async def settle_passing(self, settlements: Sequence[Settlement],
                             slots: Mapping[int, str], queues: Sequence[str], lease: float,
                             most: int) -> tuple[set[int], list[Delivery]]:
        """``settle``, and in the same transaction pass on the channel slots its results
        free: ``slots`` maps a result's id to the channel its delivery held a slot of; each
        such channel with only a concurrency limit (no rate, not ordered) starts as many
        of its due messages in ``queues`` as results of it landed, within its limit, and
        each ordered channel without other limits whose head was archived starts its
        next message in key order if that one waits and is due in ``queues`` (a head put
        back may be started again, or left to the acquire); up to ``most`` in all, leased
        for ``lease`` seconds as ``acquire`` leases them. Returns the ids that landed and
        the deliveries started (each holding a slot)."""
        ...

    # ---- channels (see sqlmq.channels) ------------------------------------------------

    async def set_channel(self, name: str, queue: str | None,
                          settings: ChannelSettings | None) -> bool:
        """Give channel ``name`` its own settings, creating it (in ``queue``, whose default
        it takes without them) if need be; None: back to its queue's default. False: a
        reset of a channel that does not exist (nothing is made)."""
        ...

    async def set_channel_default(self, queue: str, settings: ChannelSettings | None) -> None:
        """The settings of ``queue``'s channels without their own; None: no default."""
        ...

    async def forget_idle_channels(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` channel rows nothing needs: no settings of their own, no
        message of theirs in the table (waiting or running), made and last served before
        ``before``, no start held back by a rate. A publish makes its channel's row again;
        what is lost is its last turn and when it was last served, which a channel that
        comes back after being idle does not need. Without this, every channel a queue
        ever saw stayed, and with a queue default's limits each acquire read them all
        (20,000 idle limited channels: MariaDB 30 ms an acquire instead of 5). Returns how
        many rows were deleted."""
        ...

    async def channel_defaults(self) -> dict[str, ChannelSettings]:
        """The queues' defaults, by queue."""
        ...

    async def channels(self) -> list[ChannelInfo]:
        """Every channel with its settings, how many of its messages wait and run, and when
        the longest-waiting of them became due."""
        ...

    async def channel_served(self, window: float) -> dict[str, int]:
        """Per channel, how many of its messages were archived (in any final state) in the
        last ``window`` seconds of the database clock. Channels with none are left out."""
        ...

    async def channel_messages(self, channel: str, limit: int) -> list[MessageView]:
        """The live messages (waiting and running) of ``channel``, in publish order (by
        id), at most ``limit`` of them."""
        ...

    async def cancel(self, msg_id: int) -> Cancellation:
        """Cancel message ``msg_id``: archive it CANCELLED if it waits, flag it
        (``cancel_requested``) if it runs; say so if it ended already or does not exist."""
        ...

    async def cancel_requests(self, ids: Sequence[int]) -> set[int]:
        """The ids among ``ids`` (messages held by the caller) whose cancellation was asked
        for."""
        ...

    async def extend(self, leases: Sequence[tuple[int, int]], seconds: float) -> set[int]:
        """Push the lease of each held ``(id, deliveries)`` to now + ``seconds``."""
        ...

    async def landed(self, settlements: Sequence[Settlement]) -> set[int]:
        """The ids among ``settlements`` whose result the database shows as written by
        exactly that delivery (a settle whose reply was lost may have committed)."""
        ...

    def deadlock_victim(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by one of this engine's calls, says the database rolled
        that call's transaction back to break a deadlock: it wrote nothing, and made again
        it is the same call (unlike a lost connection, which leaves a commit in doubt)."""
        ...

    def commit_counter(self) -> Callable[[], int | None] | None:
        """A cheap reading that changes whenever any process commits a write, or None
        where the database offers no such thing."""
        ...

    def wake_source(
        self, on_queue: Callable[[str], None], on_all: Callable[[], None],
    ) -> WakeSource | None:
        """A source of push wake-ups for this process's subscribers, or None."""
        ...

    def dead_letter_source(
        self, on_dead: Callable[[DeadLetterNotice], None], on_connect: Callable[[], None],
    ) -> DeadLetterSource | None:
        """A source of push notices of dead letters (every message archived FAILED or
        CANCELLED, or deleted so by a subscriber that does not keep it), sent when the
        archiving transaction commits; None where the database has none (poll the
        archive)."""
        ...

    # ---- maintenance and insights ------------------------------------------------------------

    async def recover_expired(self, limit: int, spread: float = 0.0) -> list[int]:
        """Return messages whose lease expired to PENDING, each ready at a random moment
        within ``spread`` seconds, recording why in their history."""
        ...

    async def requeue_archived(
        self, *, queue: str | None = None, ids: Sequence[int] | None = None,
        state: str = State.FAILED, limit: int | None = None,
        matching: ArchiveQuery | None = None,
    ) -> int:
        """Move archived messages back to the table as fresh PENDING messages (id, payload,
        headers, priority and history kept), at most ``limit`` (lowest ids first) in one
        transaction; returns how many. A caller moving 100k rows loops on a limit, so that
        an interrupt leaves whole batches done and none half done. ``matching``: the
        filters of an archive search must match too (as ``search_archive`` reads them; its
        page, ``after`` and ``limit``, plays no part)."""
        ...

    async def purge_archived(
        self, *, queue: str | None = None, state: str | None = None,
        before: datetime | None = None, limit: int | None = None,
        ids: Sequence[int] | None = None, matching: ArchiveQuery | None = None,
    ) -> int:
        """Delete archived messages matching every filter given (``matching``: an archive
        search's filters, as for :meth:`requeue_archived`), at most ``limit`` (lowest ids
        first) in one transaction; returns how many."""
        ...

    async def stats(self) -> list[QueueStats]:
        """Per queue: counts by state and the oldest ready time."""
        ...

    async def now(self) -> datetime:
        """The database clock (leases, schedules and retries are measured on it)."""
        ...

    # ---- schema and life ---------------------------------------------------------------------

    async def migrate(self) -> int:
        """Create or upgrade sqlmq's tables; safe from many processes at once."""
        ...

    async def check_schema(self, shown_url: str) -> None:
        """Raise a clear error if the tables are missing or from another version."""
        ...

    async def close(self) -> None:
        """Release what the engine holds (kept connections, files); idempotent."""
        ...


__all__ = ["AnswerSource", "DeadLetterSource", "Engine", "WakeSource"]
