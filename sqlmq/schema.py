"""The tables sqlmq keeps, as SQLAlchemy Core objects on one ``MetaData``.

Users can hand :data:`metadata` (or one built with another prefix) to Alembic. Two
invariants the engines rely on are encoded here:

* ``next_attempt_at`` is NULL exactly while a message is PROCESSING, or waits in a channel
  (on ``channel_due_at``, read by the channels' acquire). The acquire predicate
  is then ``next_attempt_at <= now``, read from the index ``(queue, priority DESC,
  next_attempt_at, id)`` in acquire's order (``priority`` ascending on MySQL and MariaDB,
  see :func:`ready_index_asc`): no state filter, no sort of a whole backlog, on every
  database.
* ``lease_expires_at`` is set exactly while a message is PROCESSING, so recovery of expired
  leases reads one small index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from .errors import ConfigurationError

#: Bumped by every migration in :mod:`sqlmq.migrate`.
SCHEMA_VERSION = 26

DEFAULT_PREFIX = "sqlmq_"
MAX_QUEUE_NAME = 128
#: The longest deduplication key (characters). With the queue name it fits MySQL's limit on
#: an index's length (3072 bytes, four per character).
MAX_DEDUP_KEY = 255
#: The largest payload a broker accepts by default (``Broker(max_payload_bytes=)``).
DEFAULT_MAX_PAYLOAD = 10 * 1024 * 1024

#: PostgreSQL's storage parameters of the message table (schema version 24). Pages filled
#: to half at insert keep room for the version each row's acquire writes: on the same page
#: its UPDATE is logged as the changed bytes only, and needs no LOCK record to move the row
#: to another page. The acquire's WAL a message, 522 -> 332 bytes (1,000 messages of 64
#: bytes, ``pg_waldump``); the table takes twice the pages for what waits.
MESSAGE_STORAGE = {"fillfactor": 50}

#: The range of a message's ``priority`` (higher is taken first; 0 by default). The column
#: is a 32-bit INTEGER everywhere; the accepted range is narrower, that of a SMALLINT, which
#: is plenty of levels and leaves room to pack or narrow the column later.
MIN_PRIORITY = -32768
MAX_PRIORITY = 32767

# Prefixes become part of SQL identifiers, so they are validated, never quoted blindly.
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9_]{0,29}$")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on the Python side on every database.

    PostgreSQL stores ``timestamptz``; MySQL and SQLite have no zone, so UTC is stored
    naive (``DATETIME(6)`` on MySQL, ISO text with microseconds on SQLite, which sorts
    as text) and the zone is put back on read.
    """

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.TIMESTAMP(timezone=True))
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware datetime")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # a raw SQLite expression result
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class QueueName(TypeDecorator[str]):
    """Queue names compare exactly. MySQL's default collations fold case and ignore trailing
    spaces, so a subscriber to ``orders`` would also take ``Orders `` messages; a binary,
    no-pad collation keeps them apart (PostgreSQL and SQLite compare exactly already)."""

    impl = String(MAX_QUEUE_NAME)
    cache_ok = True
    length = MAX_QUEUE_NAME

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in ("mysql", "mariadb"):
            nopad = "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else (
                "utf8mb4_0900_bin")
            return dialect.type_descriptor(
                mysql.VARCHAR(self.length, charset="utf8mb4", collation=nopad)
            )
        return dialect.type_descriptor(String(self.length))


class DedupKey(QueueName):
    """Deduplication keys compare exactly too: ``Charge-1`` and ``charge-1 `` are two keys."""

    impl = String(MAX_DEDUP_KEY)
    cache_ok = True
    length = MAX_DEDUP_KEY


def _json() -> Any:
    return JSON().with_variant(postgresql.JSONB(), "postgresql")


def _payload() -> Any:
    return LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def _priority() -> Column[int]:
    """Higher is taken first among ready messages (see :data:`MIN_PRIORITY`)."""
    return Column("priority", Integer, nullable=False, server_default=text("0"))


def _control_columns() -> list[Column[Any]]:
    """Defer and cancellation (schema version 9; see :mod:`sqlmq.engines.sql.control`): what
    a handler saved with its last defer (see :func:`sqlmq.codec.encode_state`; NULL:
    nothing), how many of its deliveries ended in a defer (``max_deliveries`` does not count
    those), and whether a cancellation was asked for while it ran (1: any result but a
    success archives it CANCELLED, and an acquire archives it so without running it)."""
    return [Column("saved_state", _payload()),
            Column("defers_count", Integer, nullable=False, server_default=text("0")),
            Column("cancel_requested", Integer, nullable=False, server_default=text("0"))]


def _archive_columns() -> list[Column[Any]]:
    """The archive's ``channel`` (schema version 12): the channel the message was published
    to (NULL: none), so that a requeue puts it back under its channel's limits; and its
    ``result`` (version 22): what its handler returned, kept by a subscriber with
    ``results=True`` (NULL: nothing kept) as :func:`sqlmq.codec.encode_state` stores a
    value, written by the transaction that archives it (see :mod:`sqlmq.results`)."""
    return [Column("channel", QueueName()), Column("result", _payload())]


def _key_and_lease_indexes(m: str) -> list[Index]:
    """The unique deduplication keys per queue (schema version 6), and the leases that
    lease recovery reads; partial where the database can."""
    return [Index(f"ux_{m}_dedup", "queue", "dedup_key", unique=True,
                  postgresql_where=text("dedup_key IS NOT NULL"),
                  sqlite_where=text("dedup_key IS NOT NULL")),
            Index(f"ix_{m}_lease", "lease_expires_at",
                  postgresql_where=text("lease_expires_at IS NOT NULL"),
                  sqlite_where=text("lease_expires_at IS NOT NULL"))]


def _channel_columns() -> list[Column[Any]]:
    """Channels (schema version 10; see :mod:`sqlmq.channels`): the channel a message was
    published to (NULL: none), and while it waits, when it is due. A channel's message keeps
    ``next_attempt_at`` NULL, so the plain acquire (the ready index) never sees it; the
    channels' acquire reads ``channel_index``."""
    return [Column("channel", QueueName()), Column("channel_due_at", UTCDateTime())]


def _fair_columns() -> list[Column[Any]]:
    """A channel message's place in the fair order: its key (schema version 13, see
    :func:`fair_index`; NULL under limits), and 1 if an ordered channel gave it (version
    19, see :func:`sqlmq.engines.sql.fair.rekey`), so that the fair acquire tells an
    ordered channel's message from another without looking up the channel of each row it
    reads."""
    return [Column("fair_key", BigInteger),
            Column("ordered", Integer, nullable=False, server_default=text("0"))]


#: Which messages :func:`channel_index` holds where an index can be partial: those of
#: limited channels, which alone have no ``fair_key``.
CHANNEL_WHERE = "channel IS NOT NULL AND fair_key IS NULL"


def channel_index(message: Table) -> Index:
    """``(channel, state, channel_due_at)``: a limited channel's running deliveries (the
    count its concurrency limit is held to). Partial where the database can; MySQL and
    MariaDB cannot.

    It holds the messages of limited channels only (PostgreSQL since version 18, SQLite
    since 20), as :func:`channel_due_index` does since 17: nothing counts the running
    deliveries of the others, and each of their publishes, takes and settles wrote an
    entry of it, on a page of its own per channel (a channel's size is counted on
    ``channel_key_index``). The drain of 1,000 channels without limits, ten alternating
    pairs against version 17 on PostgreSQL: 5.5 % faster (the median ratio); of 1,000
    ordered channels on SQLite, the index switched in four alternating pairs: medians
    5,475 -> 6,618 msg/s (a noisy machine: five later pairs of the whole change, 6,538
    -> 6,752). A count of running
    deliveries then says ``fair_key IS NULL``, so that the planner may read it
    (:func:`limited_rows`); SQLite's planner, with statistics, read such a count by
    ``(channel, fair_key)`` (every message of a limited channel) rather than ``(channel,
    state)``, so SQLite's counts name the index (``INDEXED BY``, in
    :mod:`sqlmq.engines.sqlite.statements`)."""
    return Index(f"ix_{message.name}_channel", message.c.channel, message.c.state,
                 message.c.channel_due_at,
                 postgresql_where=text(CHANNEL_WHERE),
                 sqlite_where=text(CHANNEL_WHERE))


def limited_rows(index: Index, dialect_name: str, m: Any) -> list[Any]:
    """What a count of a limited channel's running deliveries in message table ``m`` adds
    so that the planner may read ``index`` (:func:`channel_index`), where it holds those
    of limited channels only: ``fair_key IS NULL``, which such a channel's messages have."""
    where = index.dialect_kwargs.get(f"{dialect_name}_where")
    return [m.c.fair_key.is_(None)] if where is not None and "fair_key" in str(where) else []


def fair_index(message: Table) -> Index:
    """``(queue, fair_key, id)``: the channels' messages in their queue's fair order (schema
    version 13). ``fair_key`` packs a channel message's priority and its channel's turn
    (see :func:`sqlmq.channels.fair_key`), so that channels without limits are taken by
    one ordered read of this index, as plain messages are of the ready index; every
    channel shares each turn, so ``id`` orders within one (without it, PostgreSQL read
    each turn whole to sort it). Partial where
    the database can: a waiting channel message only (``channel_due_at`` set). MySQL and
    MariaDB keep an entry per row, a NULL key for the others, which sorts before the
    keys a read looks for."""
    return Index(f"ix_{message.name}_fair", message.c.queue, message.c.fair_key, message.c.id,
                 postgresql_where=text("channel_due_at IS NOT NULL"),
                 sqlite_where=text("channel_due_at IS NOT NULL"))


def channel_key_index(message: Table) -> Index:
    """``(channel, fair_key, id)``: whether anything of an ordered channel comes before a
    message in key order (schema version 14), one probe for the fair acquire, whatever the
    channel's backlog. Partial where the database can, as ``channel_index``."""
    return Index(f"ix_{message.name}_channel_key", message.c.channel, message.c.fair_key,
                 message.c.id,
                 postgresql_where=text("channel IS NOT NULL"),
                 sqlite_where=text("channel IS NOT NULL"))


#: Which messages :func:`channel_due_index` holds where an index can be partial: the waiting
#: messages of limited channels, which alone have no ``fair_key``.
CHANNEL_DUE_WHERE = "channel_due_at IS NOT NULL AND fair_key IS NULL"


def channel_due_index(message: Table) -> Index:
    """``(channel, priority DESC, channel_due_at, id)`` of waiting channel messages: a
    limited channel's next messages in acquire order, read up to its allowance instead of
    every due message of the channel (schema version 14 on PostgreSQL and SQLite, partial;
    15 on MySQL and MariaDB, whole, where a running message's NULL due time sorts first).
    MariaDB before 10.8 keeps the index ascending: still right, one sort per channel.

    Since version 17 the partial index leaves out the messages of channels without limits
    (those with a ``fair_key``, which the fair index serves): each of their publishes
    wrote an entry of it and each take removed it, on a page of its own per channel. On
    SQLite, 1,000 ordered channels drained 28-39 % faster without it."""
    c = message.c
    return Index(f"ix_{message.name}_channel_due", c.channel, c.priority.desc(),
                 c.channel_due_at, c.id,
                 postgresql_where=text(CHANNEL_DUE_WHERE),
                 sqlite_where=text(CHANNEL_DUE_WHERE))


def ready_index(message: Table) -> Index:
    """The index acquire reads on PostgreSQL and SQLite, in acquire's order: highest priority
    first, then ready time, then id (FIFO within a priority). Partial: PROCESSING rows (no
    ready time) are not in it. Schema version 3 put ``priority`` in it; the migration
    rebuilds it from this definition."""
    c = message.c
    return Index(
        f"ix_{message.name}_ready",
        c.queue,
        c.priority.desc(),
        c.next_attempt_at,
        c.id,
        postgresql_where=text("next_attempt_at IS NOT NULL"),
        sqlite_where=text("next_attempt_at IS NOT NULL"),
    ).ddl_if(dialect=("postgresql", "sqlite"))


def ready_index_asc(message: Table) -> Index:
    """The index acquire reads on MySQL and MariaDB: ``(queue, priority, next_attempt_at,
    id)``, priority ascending. These databases have no partial index, so a level begins
    with its in-flight entries; acquire finds each level by reading backwards from above it,
    landing on the level's last entry (see ACQUIRE_LEVEL in
    :mod:`sqlmq.engines.mysql.statements`). Part of schema version 4."""
    c = message.c
    return Index(f"ix_{message.name}_ready_asc", c.queue, c.priority, c.next_attempt_at,
                 c.id).ddl_if(dialect=("mysql", "mariadb"))


def ready_index_of(schema: Schema) -> Index:
    """The ready index of ``schema``'s message table (the object :func:`ready_index` put
    there)."""
    return _index_of(schema, f"ix_{schema.message.name}_ready")


def dedup_index_of(schema: Schema) -> Index:
    """The unique index of ``schema``'s deduplication keys (schema version 6)."""
    return _index_of(schema, f"ux_{schema.message.name}_dedup")


def fair_index_of(schema: Schema) -> Index:
    """The fair-order index of ``schema``'s message table (schema version 13)."""
    return _index_of(schema, f"ix_{schema.message.name}_fair")


def channel_key_index_of(schema: Schema) -> Index:
    """The ordered channels' index of ``schema``'s message table (schema version 14)."""
    return _index_of(schema, f"ix_{schema.message.name}_channel_key")


def channel_due_index_of(schema: Schema) -> Index:
    """The limited channels' pick index of ``schema``'s message table (schema versions 14
    and 15)."""
    return _index_of(schema, f"ix_{schema.message.name}_channel_due")


def channel_index_of(schema: Schema) -> Index:
    """The channel index of ``schema``'s message table (schema version 10)."""
    return _index_of(schema, f"ix_{schema.message.name}_channel")


def _index_of(schema: Schema, name: str) -> Index:
    return next(ix for ix in schema.message.indexes if ix.name == name)


def _id() -> Any:
    # SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
    return BigInteger().with_variant(Integer(), "sqlite")


@dataclass(frozen=True)
class Schema:
    """The tables of one prefix. Engines format their SQL with :attr:`names`."""

    prefix: str
    metadata: MetaData
    message: Table
    archive: Table
    version: Table
    spark_consumer: Table
    spark_lease: Table
    spark_staging: Table
    spark_sink_batch: Table
    #: Consumer groups of topics (schema version 7; see :mod:`sqlmq.topics`).
    topic_group: Table
    #: Periodic schedules and the ticks they published (schema version 8; see
    #: :mod:`sqlmq.schedules`).
    schedule: Table
    schedule_tick: Table
    #: Channels and the queues' defaults for them (schema version 10; see
    #: :mod:`sqlmq.channels`).
    channel: Table
    channel_default: Table
    #: Per queue, the turn its channels without limits are served at (schema version 13).
    channel_clock: Table
    #: The live workers registry and the paused queues (schema version 11; see
    #: :mod:`sqlmq.maintenance.heartbeat` and :mod:`sqlmq.engines.sql.operations`).
    worker: Table
    queue_pause: Table
    #: The far messages the inbox has taken, by source and key (schema version 21; see
    #: :mod:`sqlmq.relay.ledger`).
    inbox_seen: Table
    #: Workflows' steps and what each waits for (schema version 23; see
    #: :mod:`sqlmq.workflows`).
    step: Table
    step_need: Table
    #: The signals sent to messages that wait for them (schema version 23).
    signal: Table

    @property
    def tables(self) -> list[Table]:
        """Every table of the prefix (the metadata may hold the user's tables too)."""
        return [value for value in vars(self).values() if isinstance(value, Table)]

    @property
    def names(self) -> dict[str, str]:
        return {"m": self.message.name, "a": self.archive.name, "v": self.version.name,
                "pause": self.queue_pause.name, "channel": self.channel.name,
                "channel_default": self.channel_default.name,
                "channel_clock": self.channel_clock.name}


def build_schema(prefix: str = DEFAULT_PREFIX, metadata: MetaData | None = None) -> Schema:
    """Tables named ``{prefix}message``, ``{prefix}archive`` and ``{prefix}schema``."""
    check_prefix(prefix)
    md = metadata if metadata is not None else MetaData()
    m = f"{prefix}message"
    message = Table(
        m,
        md,
        Column("id", _id(), primary_key=True, autoincrement=True),
        Column("queue", QueueName(), nullable=False),
        Column("headers", _json(), nullable=False),
        Column("payload", _payload(), nullable=False),
        Column("state", String(10), nullable=False, server_default=text("'PENDING'")),
        Column("attempts_count", Integer, nullable=False, server_default=text("0")),
        Column("deliveries_count", Integer, nullable=False, server_default=text("0")),
        Column("created_at", UTCDateTime(), nullable=False),
        Column("first_attempt_at", UTCDateTime()),
        Column("next_attempt_at", UTCDateTime()),
        Column("last_attempt_at", UTCDateTime()),
        Column("acquired_at", UTCDateTime()),
        Column("lease_expires_at", UTCDateTime()),
        Column("last_error", Text),
        Column("history", _json()),
        _priority(),
        # schema version 5: when the message expires (NULL: never). Read by the runtime from
        # each delivery, not by acquire, so no index: see sqlmq.lifecycle.unrunnable.
        Column("expires_at", UTCDateTime()),
        # schema version 6: the deduplication key (NULL: none). Unique per queue among the
        # rows of this table, so while a message waits or runs, a publish with its key finds
        # it (see sqlmq.engines.sql.publish); an archived message has left the table and freed it.
        Column("dedup_key", DedupKey()),
        *_control_columns(),  # schema version 9
        *_channel_columns(),  # schema version 10
        *_fair_columns(),  # schema versions 13 and 19
        Column("waits_for", QueueName()),  # version 23: msg.wait_for's signal (sqlmq.workflows)
        *_key_and_lease_indexes(m),
        # Without AUTOINCREMENT SQLite reuses the ids of deleted rows: once the newest
        # messages are archived, a new message would get an id the archive already has.
        sqlite_autoincrement=True, postgresql_with=MESSAGE_STORAGE,  # the latter: version 24
    )
    ready_index(message)
    ready_index_asc(message)
    channel_index(message)
    fair_index(message)
    channel_key_index(message)
    channel_due_index(message)
    a = f"{prefix}archive"
    archive = Table(
        a,
        md,
        Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
               autoincrement=False),
        Column("queue", QueueName(), nullable=False),
        Column("headers", _json(), nullable=False),
        Column("payload", _payload(), nullable=False),
        Column("state", String(10), nullable=False),
        Column("attempts_count", Integer, nullable=False),
        Column("deliveries_count", Integer, nullable=False),
        Column("created_at", UTCDateTime(), nullable=False),
        Column("first_attempt_at", UTCDateTime()),
        Column("last_attempt_at", UTCDateTime()),
        Column("archived_at", UTCDateTime(), nullable=False),
        Column("error", Text),
        Column("history", _json()),
        _priority(),
        *_archive_columns(),  # schema versions 12 and 22
        Index(f"ix_{a}_queue_archived", "queue", "archived_at"),
        Index(f"ix_{a}_state_archived", "state", "archived_at"),
    )
    version = Table(
        f"{prefix}schema",
        md,
        Column("version", Integer, primary_key=True, autoincrement=False),
        Column("applied_at", UTCDateTime(), nullable=False),
    )
    return Schema(prefix, md, message, archive, version, *_spark_tables(prefix, md),
                  _topic_group(prefix, md), *_schedule_tables(prefix, md),
                  *_channel_tables(prefix, md), *_operations_tables(prefix, md),
                  _inbox_seen(prefix, md), *_workflow_tables(prefix, md),
                  _signal_table(prefix, md))


def _workflow_tables(prefix: str, md: MetaData) -> tuple[Table, Table]:
    """Schema version 23: a workflow's steps (see :mod:`sqlmq.workflows`).

    ``step``: a row per step, keyed by its message's id, named in its workflow. A step
    that waits for others is a message row in state WAITING, out of every acquire's reach
    (no due time, no channel); its row here keeps what its publish would have set (its
    channel, its delay or moment) and how many of its dependencies have still to end
    (``waiting``). ``status``: WAITING, RELEASED (its message was published, at once or
    when its last dependency ended) or CANCELLED (a dependency failed). ``step_need``: an
    edge per dependency, keyed by the dependency first: a settle looks up what waits on
    the messages it ended."""
    name = f"{prefix}step"
    step = Table(
        name,
        md,
        Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
               autoincrement=False),
        Column("workflow", QueueName(), nullable=False),
        Column("name", QueueName(), nullable=False),
        Column("queue", QueueName(), nullable=False),
        Column("channel", QueueName()),
        Column("delay_seconds", Float),
        Column("due_at", UTCDateTime()),
        Column("waiting", Integer, nullable=False),
        Column("on_failure", String(10), nullable=False),
        Column("status", String(10), nullable=False),
        Column("created_at", UTCDateTime(), nullable=False),
        Index(f"ux_{name}_name", "workflow", "name", unique=True),
    )
    need = Table(
        f"{prefix}step_need",
        md,
        Column("needs", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
               autoincrement=False),
        Column("step", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
               autoincrement=False),
        Index(f"ix_{prefix}step_need_step", "step"),
    )
    return step, need


def _signal_table(prefix: str, md: MetaData) -> Table:
    """Schema version 23: the signals sent to messages (``Broker.signal``), one per message
    and name (a later one replaces it). ``read_by``: the delivery that read it
    (``msg.signal()``); the message's next ``wait_for`` forgets those, and takes one that
    nobody read yet as arrived."""
    return Table(
        f"{prefix}signal",
        md,
        Column("message_id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
               autoincrement=False),
        Column("name", QueueName(), primary_key=True),
        Column("payload", _payload()),
        Column("sent_at", UTCDateTime(), nullable=False),
        Column("read_by", Integer),
    )


#: The longest host name a worker row keeps (characters; longer ones are cut).
MAX_HOST = 255


def _inbox_seen(prefix: str, md: MetaData) -> Table:
    """Schema version 21: a row per far message the inbox took (see
    :mod:`sqlmq.relay.ledger`), written in the transaction that publishes it, so that a
    redelivery by the far broker finds it and writes nothing, even once the message has
    left the queue (a deduplication key only holds while its message waits or runs).
    ``source`` names where it came from (a RabbitMQ queue, a JetStream consumer, a Redis
    stream's group), ``msg_key`` the far message's id there, ``message_id`` the message it
    became. Rows older than the inbox's retention are deleted, by ``(source, taken_at)``."""
    name = f"{prefix}inbox_seen"
    return Table(
        name,
        md,
        Column("source", DedupKey(), primary_key=True),
        Column("msg_key", DedupKey(), primary_key=True),
        Column("message_id", BigInteger),
        Column("taken_at", UTCDateTime(), nullable=False),
        Index(f"ix_{name}_taken", "source", "taken_at"),
    )


def _operations_tables(prefix: str, md: MetaData) -> tuple[Table, Table]:
    """Schema version 11: what operators see and steer.

    ``worker``: a row per running broker (one with started subscribers), written by its
    heartbeat (:mod:`sqlmq.maintenance.heartbeat`): who it is (host, pid, sqlmq version), its
    subscribers and their settings (JSON), what it runs and holds, and until when the row is
    believed (``expires_at``: the last heartbeat plus a few of the writer's own intervals, so
    brokers with different intervals judge each other rightly). A row past it is a dead
    process's, deleted by whichever broker heartbeats next.

    ``queue_pause``: a row per paused queue. Every acquire (plain, channels, the hand-over of
    a publish, the Spark source) takes nothing from a queue that has one; tiny, read by
    primary key."""
    worker = Table(
        f"{prefix}worker",
        md,
        Column("id", String(36), primary_key=True),
        Column("host", String(MAX_HOST), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("version", String(64), nullable=False),
        Column("started_at", UTCDateTime(), nullable=False),
        Column("heartbeat_at", UTCDateTime(), nullable=False),
        Column("expires_at", UTCDateTime(), nullable=False),
        Column("subscribers", _json(), nullable=False),
        Column("running", Integer, nullable=False, server_default=text("0")),
        Column("held", Integer, nullable=False, server_default=text("0")),
    )
    pause = Table(
        f"{prefix}queue_pause",
        md,
        Column("queue", QueueName(), primary_key=True),
        Column("paused_at", UTCDateTime(), nullable=False),
    )
    return worker, pause


def _channel_settings() -> list[Column[Any]]:
    return [Column("max_concurrency", Integer), Column("rate", Float),
            Column("ordered", Integer, nullable=False, server_default=text("0")),
            Column("max_size", Integer)]


def _channel_tables(prefix: str, md: MetaData) -> tuple[Table, Table, Table]:
    """``channel``: a row per channel, made by its first publish (or by its settings): the
    queue of that publish (whose default it takes), its own settings if ``configured``,
    when it was last served (fair sharing serves the least recently served first; the
    channels one acquire served share its time, and ``served_rank`` keeps the order it served
    them in, so that the next acquire does not favour the first names) and when
    its rate lets it start next, and the last turn its messages were given
    (``last_turn``, schema version 13), and an upper bound of how many messages it holds
    (``size_bound``, schema version 16, kept while it has a ``max_size``). Its publishes,
    and the acquires of a channel with limits, lock the row, so they take turns per
    channel.
    ``channel_default``: a queue's settings for its channels without their own.
    ``channel_clock``: per queue, the turn its channels are being served at, which a channel
    that had no waiting message joins (schema version 13; see
    :func:`sqlmq.channels.turns`)."""
    channel = Table(
        f"{prefix}channel",
        md,
        Column("name", QueueName(), primary_key=True),
        Column("queue", QueueName(), nullable=False),
        Column("configured", Integer, nullable=False, server_default=text("0")),
        *_channel_settings(),
        Column("created_at", UTCDateTime(), nullable=False),
        Column("served_at", UTCDateTime()),
        Column("served_rank", Integer),
        Column("next_start_at", UTCDateTime()),
        Column("last_turn", BigInteger, nullable=False, server_default=text("0")),
        # schema version 16: at least how many messages the channel holds (NULL: unknown),
        # so that a publish checks max_size without counting them (see core_room).
        Column("size_bound", BigInteger),
    )
    default = Table(
        f"{prefix}channel_default",
        md,
        Column("queue", QueueName(), primary_key=True),
        *_channel_settings(),
    )
    clock = Table(
        f"{prefix}channel_clock",
        md,
        Column("queue", QueueName(), primary_key=True),
        Column("turn", BigInteger, nullable=False),
    )
    return channel, default, clock


def _topic_group(prefix: str, md: MetaData) -> Table:
    """A row per consumer group (see :mod:`sqlmq.topics`): the pattern it subscribes to,
    its name, the queue its copies go to (named after both: the key), when it was made."""
    return Table(
        f"{prefix}topic_group",
        md,
        Column("queue", QueueName(), primary_key=True),
        Column("pattern", QueueName(), nullable=False),
        Column("group_name", QueueName(), nullable=False),
        Column("created_at", UTCDateTime(), nullable=False),
    )


#: The longest cron expression a schedule may have (characters).
MAX_CRON = 200


def _schedule_tables(prefix: str, md: MetaData) -> tuple[Table, Table]:
    """Periodic schedules (see :mod:`sqlmq.schedules`).

    ``schedule``: a row per schedule, as the processes that run it registered it: its
    queue and cadence (a cron expression in a time zone, or a fixed interval in
    microseconds), its catch-up
    policy, since when this cadence holds (``registered_at``: ticks before it are not its
    own) and the last tick it published. A process that publishes a tick locks this row
    first, so processes take turns per schedule and a tick at or before ``last_tick_at`` is
    never published again. ``paused_at`` (schema version 25; NULL: running): since when an
    operator paused it; no process publishes its ticks while it is set, and registering the
    schedule again (a restart, a deploy) leaves it paused. ``schedule_tick``: the ticks
    published recently, one row per (schedule, tick) under the primary key, so that even a
    process that did not take the lock could not publish a tick twice; it names the message
    each tick published.
    """
    schedule = Table(
        f"{prefix}schedule",
        md,
        Column("name", QueueName(), primary_key=True),
        Column("queue", QueueName(), nullable=False),
        Column("cron", String(MAX_CRON)),
        Column("tz", String(64), nullable=False),
        Column("every_micros", BigInteger),
        Column("catch_up", String(10), nullable=False),
        Column("registered_at", UTCDateTime(), nullable=False),
        Column("last_tick_at", UTCDateTime()),
        Column("last_message_id", BigInteger),
        Column("paused_at", UTCDateTime()),
    )
    tick = Table(
        f"{prefix}schedule_tick",
        md,
        Column("schedule", QueueName(), primary_key=True),
        Column("tick_at", UTCDateTime(), primary_key=True),
        Column("message_id", BigInteger, nullable=False),
        Column("published_at", UTCDateTime(), nullable=False),
    )
    return schedule, tick


def _spark_tables(prefix: str, md: MetaData) -> tuple[Table, Table, Table, Table]:
    """Bookkeeping of the Spark source and sink (schema version 2).

    ``spark_consumer``: one row per named stream, its owner and heartbeat (one running query
    per name) and its lease sequence; ``spark_lease``: the deliveries each sequence number
    leased, kept until Spark commits it; ``spark_staging``: rows written by executors, moved
    to the message table by the driver's commit; ``spark_sink_batch``: the streaming batch
    ids a sink has published, so a replayed batch is not published twice.
    """
    consumer = Table(
        f"{prefix}spark_consumer",
        md,
        Column("consumer", String(MAX_QUEUE_NAME), primary_key=True),
        Column("queue", QueueName(), nullable=False),
        Column("owner", String(64)),
        Column("heartbeat_at", UTCDateTime()),
        Column("leased_seq", BigInteger, nullable=False, server_default=text("0")),
        Column("acked_seq", BigInteger, nullable=False, server_default=text("0")),
    )
    lease = Table(
        f"{prefix}spark_lease",
        md,
        Column("consumer", String(MAX_QUEUE_NAME), primary_key=True),
        Column("seq", BigInteger, primary_key=True, autoincrement=False),
        Column("id", BigInteger, primary_key=True, autoincrement=False),
        Column("deliveries", Integer, nullable=False),
        Column("attempts", Integer, nullable=False),
    )
    s = f"{prefix}spark_staging"
    staging = Table(
        s,
        md,
        Column("row_id", _id(), primary_key=True, autoincrement=True),
        Column("token", String(64), nullable=False),
        Column("attempt", BigInteger, nullable=False),
        Column("queue", QueueName(), nullable=False),
        Column("headers", _json(), nullable=False),
        Column("payload", _payload(), nullable=False),
        Column("delay", Float, nullable=False),
        Column("staged_at", UTCDateTime(), nullable=False),
        _priority(),  # schema version 3
        Index(f"ix_{s}_token", "token", "attempt"),
    )
    batch = Table(
        f"{prefix}spark_sink_batch",
        md,
        Column("sink", String(MAX_QUEUE_NAME), primary_key=True),
        Column("batch_id", BigInteger, primary_key=True, autoincrement=False),
        Column("committed_at", UTCDateTime(), nullable=False),
    )
    return consumer, lease, staging, batch


def check_prefix(prefix: str) -> None:
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):  # `$` allows "\n"
        raise ConfigurationError(
            f"table prefix {prefix!r} is not allowed: use 1-30 lowercase letters, digits or "
            "underscores, starting with a letter"
        )


#: The default schema's tables (prefix ``sqlmq_``), for Alembic and direct queries.
default_schema = build_schema()
metadata = default_schema.metadata
message_table = default_schema.message
archive_table = default_schema.archive
