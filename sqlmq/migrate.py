"""Versioned schema migrations, applied by ``sqlmq migrate`` or ``await broker.migrate()``.

Each step is idempotent and recorded in ``{prefix}schema``; concurrent migrators are
serialised by a database lock, so starting ten workers that all migrate is safe. A database
with none of the prefix's tables gets the latest schema in one pass (:func:`_create`), with
every version recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Column,
    Connection,
    Index,
    MetaData,
    String,
    Table,
    bindparam,
    func,
    inspect,
    select,
    update,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn, ExecutableDDLElement

from .channels import NO_LIMITS, ChannelSettings, Turns
from .connect import READ_ONLY
from .errors import SchemaError
from .lifecycle import State
from .schema import (
    SCHEMA_VERSION,
    Schema,
    channel_due_index_of,
    channel_index_of,
    channel_key_index_of,
    dedup_index_of,
    fair_index_of,
    ready_index_of,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


def _v1(conn: Connection, schema: Schema) -> None:
    schema.metadata.create_all(
        conn, tables=[schema.message, schema.archive, schema.version], checkfirst=True
    )


def _v2(conn: Connection, schema: Schema) -> None:
    schema.metadata.create_all(
        conn,
        tables=[schema.spark_consumer, schema.spark_lease, schema.spark_staging,
                schema.spark_sink_batch],
        checkfirst=True,
    )


def _v3(conn: Connection, schema: Schema) -> None:
    """Priority: a ``priority`` column (INTEGER NOT NULL DEFAULT 0) on the message table,
    the archive and the Spark sink's staging table, and the ready index rebuilt as
    ``(queue, priority DESC, next_attempt_at, id)`` on PostgreSQL and SQLite (MySQL's and
    MariaDB's is version 4's; version 3 as first released rebuilt theirs so too, with a due
    index beside it, and version 4 drops both). Every step looks before it acts: MySQL
    commits each DDL statement on its own, so a migrator that died half way leaves some of
    them done, and the next one finishes the rest. Adding a
    column with a constant default rewrites no table on any of the three databases;
    building an index reads the whole message table once, holding writes off it meanwhile
    (the usual CREATE INDEX lock)."""
    look = inspect(conn)
    for table in (schema.message, schema.archive, schema.spark_staging):
        if "priority" not in {c["name"] for c in look.get_columns(table.name)}:
            conn.execute(AddColumn(table.c.priority))
    indexes = {ix["name"]: ix for ix in look.get_indexes(schema.message.name)}
    index = ready_index_of(schema)
    found = indexes.get(index.name)
    if found is None or "priority" not in found["column_names"]:
        if found is not None:
            index.drop(conn)
        index.create(conn)


def _v4(conn: Connection, schema: Schema) -> None:
    """MySQL and MariaDB: the ready index becomes ``ix_{m}_ready_asc`` (see
    :func:`sqlmq.schema.ready_index_asc`), and the indexes it replaces go: ``ix_{m}_ready``
    and the due index ``(queue, next_attempt_at)`` of version 3 as first released. One
    index fewer for every insert, acquire and delete to maintain, and no lock on the due
    index for settle's DELETE to deadlock on. Elsewhere nothing happens: each index is made
    only where it belongs (its ``ddl_if``), and an index is obsolete only where its
    replacement now exists. Looks before it acts, as version 3."""
    m = schema.message.name
    have = _index_names(conn, schema)
    for index in schema.message.indexes:  # the ready indexes, not those of later versions
        if index.name.startswith(f"ix_{m}_ready") and index.name not in have:
            index.create(conn)  # a no-op where its ddl_if excludes this database
    have = _index_names(conn, schema)
    obsolete = {f"ix_{m}_due"}
    if f"ix_{m}_ready_asc" in have:
        obsolete.add(f"ix_{m}_ready")
    # indexes of a stand-in table (same name, a column each): the DDL names the index and
    # the table; sqlmq's own MetaData does not keep these indexes
    stand_in = Table(m, MetaData(), Column("queue", String(8)))
    for name in sorted(obsolete & have):
        Index(name, stand_in.c.queue).drop(conn)


def _v5(conn: Connection, schema: Schema) -> None:
    """Expiry: an ``expires_at`` column (NULL: never) on the message table. Nullable with no
    default, so no table is rewritten; looks before it acts, as version 3."""
    if "expires_at" not in {c["name"] for c in inspect(conn).get_columns(schema.message.name)}:
        conn.execute(AddColumn(schema.message.c.expires_at))


def _v6(conn: Connection, schema: Schema) -> None:
    """Deduplication keys: a ``dedup_key`` column (NULL: none) on the message table and its
    unique index per queue (partial on PostgreSQL and SQLite: only rows with a key). Looks
    before it acts, as version 3."""
    m = schema.message
    if "dedup_key" not in {c["name"] for c in inspect(conn).get_columns(m.name)}:
        conn.execute(AddColumn(m.c.dedup_key))
    _create_missing(conn, schema, dedup_index_of(schema))


def _v7(conn: Connection, schema: Schema) -> None:
    """Topics: the consumer group table (see :mod:`sqlmq.topics`)."""
    schema.metadata.create_all(conn, tables=[schema.topic_group], checkfirst=True)


def _v8(conn: Connection, schema: Schema) -> None:
    """Periodic schedules: the schedule and tick tables (see :mod:`sqlmq.schedules`)."""
    schema.metadata.create_all(conn, tables=[schema.schedule, schema.schedule_tick],
                               checkfirst=True)


def _v9(conn: Connection, schema: Schema) -> None:
    """Defer and cancellation: the message table's ``saved_state``, ``defers_count`` and
    ``cancel_requested`` columns (constant defaults: no table is rewritten). Each column is
    looked for first, as in :func:`_v3`."""
    have = {c["name"] for c in inspect(conn).get_columns(schema.message.name)}
    for name in ("saved_state", "defers_count", "cancel_requested"):
        if name not in have:
            conn.execute(AddColumn(schema.message.c[name]))


def _v10(conn: Connection, schema: Schema) -> None:
    """Channels: the message table's ``channel`` and ``channel_due_at`` (NULL by default: no
    table is rewritten) and their index, and the channel tables."""
    m = schema.message
    have = {c["name"] for c in inspect(conn).get_columns(m.name)}
    for name in ("channel", "channel_due_at"):
        if name not in have:
            conn.execute(AddColumn(m.c[name]))
    _create_missing(conn, schema, channel_index_of(schema))
    schema.metadata.create_all(conn, tables=[schema.channel, schema.channel_default],
                               checkfirst=True)


def _v11(conn: Connection, schema: Schema) -> None:
    """Operations: the live workers registry and the paused queues (two new tables; the
    message table is untouched)."""
    schema.metadata.create_all(conn, tables=[schema.worker, schema.queue_pause],
                               checkfirst=True)


def _v12(conn: Connection, schema: Schema) -> None:
    """The archive's ``channel`` (NULL by default: no table is rewritten), so a requeued
    message goes back to its channel."""
    a = schema.archive
    if "channel" not in {c["name"] for c in inspect(conn).get_columns(a.name)}:
        conn.execute(AddColumn(a.c.channel))


def _v13(conn: Connection, schema: Schema) -> None:
    """Fair order (see :mod:`sqlmq.channels`): the message table's ``fair_key`` and its
    index, the channel table's ``last_turn``, the queues' clocks. The channel messages
    already there, in channels without limits, get their turns as a publish would have
    given them (a channel's n-th message turn n, keyed by its quantum, priority above), so
    none is left out of the fair acquire."""
    m, c = schema.message, schema.channel
    if "fair_key" not in {col["name"] for col in inspect(conn).get_columns(m.name)}:
        conn.execute(AddColumn(m.c.fair_key))
    if "last_turn" not in {col["name"] for col in inspect(conn).get_columns(c.name)}:
        conn.execute(AddColumn(c.c.last_turn))
    _create_missing(conn, schema, fair_index_of(schema))
    schema.metadata.create_all(conn, tables=[schema.channel_clock], checkfirst=True)
    free = {r.name for r, settings in _channel_settings(conn, schema)
            if not _limited_in_v13(settings)}
    turns: dict[str, int] = {}
    keys = []
    for msg_id, channel, priority in conn.execute(
            select(m.c.id, m.c.channel, m.c.priority)
            .where(m.c.channel.is_not(None), m.c.fair_key.is_(None)).order_by(m.c.id)):
        if channel in free:
            turns[channel] = turns.get(channel, 0) + 1
            keys.append({"i": msg_id, "k": Turns(turns[channel]).key(priority)})
    _write_keys(conn, schema, keys, turns)


def _channel_settings(conn: Connection,
                      schema: Schema) -> list[tuple[Any, ChannelSettings]]:
    """Each channel row with the settings that apply to it: its own, else its queue's
    default, else none."""
    defaults = {r.queue: ChannelSettings.from_row(r)
                for r in conn.execute(select(schema.channel_default))}
    return [(r, ChannelSettings.from_row(r) if r.configured
             else defaults.get(r.queue, NO_LIMITS))
            for r in conn.execute(select(schema.channel))]


def _write_keys(conn: Connection, schema: Schema, keys: list[dict[str, int]],
                last_turns: dict[str, int]) -> None:
    """Store messages' fair keys (``{"i": id, "k": key}``) and their channels' last turns."""
    m, c = schema.message, schema.channel
    if keys:
        conn.execute(update(m).where(m.c.id == bindparam("i")).values(
            fair_key=bindparam("k")), keys)
        conn.execute(update(c).where(c.c.name == bindparam("n")).values(
            last_turn=bindparam("t")), [{"n": n, "t": t} for n, t in last_turns.items()])


def _limited_in_v13(settings: ChannelSettings) -> bool:
    """Outside the fair order as version 13 made it: ordered channels too (14 brings them
    in)."""
    return settings.limited or settings.ordered


def _v14(conn: Connection, schema: Schema) -> None:
    """Ordered channels without other limits join the fair order (see
    :mod:`sqlmq.channels`): the index ``(channel, fair_key, id)`` (and the limited
    channels' pick index, which version 14 made on PostgreSQL and SQLite; on MySQL and
    MariaDB whichever of 14 and 15 runs first makes it), and their messages, which
    had no key (the limited acquire took them), get turns after their channel's last, its
    running ones first, then in id order, without their priority, as
    :func:`.engines.core_fair.rekey` gives them."""
    m = schema.message
    _create_missing(conn, schema, channel_key_index_of(schema), channel_due_index_of(schema))
    last = {r.name: r.last_turn for r, settings in _channel_settings(conn, schema)
            if settings.ordered and not settings.limited}
    keys = []
    for msg_id, channel in conn.execute(
            select(m.c.id, m.c.channel).where(m.c.channel.in_(list(last)))
            .order_by(m.c.state != State.PROCESSING.value, m.c.id)):
        last[channel] += 1
        keys.append({"i": msg_id, "k": Turns(last[channel], ordered=True).key(0)})
    _write_keys(conn, schema, keys, last)


def _v15(conn: Connection, schema: Schema) -> None:
    """The limited channels' pick index on MySQL and MariaDB too (version 14 made it on
    PostgreSQL and SQLite only): their pick read every due message of the channels it
    served, at every acquire."""
    _create_missing(conn, schema, channel_due_index_of(schema))


def _v16(conn: Connection, schema: Schema) -> None:
    """The channel table's ``size_bound`` (NULL: unknown, so the next publish under a
    ``max_size`` counts, as every publish did before): a publish checks ``max_size``
    against it without counting the channel's messages while they fit."""
    c = schema.channel
    if "size_bound" not in {col["name"] for col in inspect(conn).get_columns(c.name)}:
        conn.execute(AddColumn(c.c.size_bound))


def _v17(conn: Connection, schema: Schema) -> None:
    """The limited channels' pick index without the messages of channels without limits,
    where an index can be partial (PostgreSQL, SQLite; see
    :func:`~sqlmq.schema.channel_due_index`): made anew. MySQL and MariaDB keep theirs."""
    _partial_anew(conn, schema, channel_due_index_of(schema))


def _v18(conn: Connection, schema: Schema) -> None:
    """The running counts' index without the messages of channels without limits, on
    PostgreSQL (see :func:`~sqlmq.schema.channel_index`): made anew, as 17's. SQLite,
    MySQL and MariaDB keep theirs."""
    _partial_anew(conn, schema, channel_index_of(schema))


def _v19(conn: Connection, schema: Schema) -> None:
    """The message table's ``ordered`` (0 by default: a constant, no table is rewritten),
    set on the keyed messages of the channels ordered without other limits, whose keys
    :func:`_v14` and :func:`.engines.core_fair.rekey` gave as an ordered channel's: the
    fair acquire reads it from the row instead of looking up each row's channel."""
    m = schema.message
    if "ordered" not in {col["name"] for col in inspect(conn).get_columns(m.name)}:
        conn.execute(AddColumn(m.c.ordered))
    names = [r.name for r, settings in _channel_settings(conn, schema)
             if settings.ordered and not settings.limited]
    for start in range(0, len(names), 500):
        conn.execute(update(m).where(m.c.channel.in_(names[start : start + 500]),
                                     m.c.fair_key.is_not(None)).values(ordered=1))


def _v20(conn: Connection, schema: Schema) -> None:
    """The running counts' index without the messages of channels without limits on
    SQLite too (see :func:`~sqlmq.schema.channel_index`): made anew, as 18's on
    PostgreSQL, which keeps that one."""
    _partial_anew(conn, schema, channel_index_of(schema))


def _v21(conn: Connection, schema: Schema) -> None:
    """The inbox's ledger of the far messages it took (a new table; see
    :mod:`sqlmq.relay.ledger`)."""
    schema.metadata.create_all(conn, tables=[schema.inbox_seen], checkfirst=True)


def _v22(conn: Connection, schema: Schema) -> None:
    """The archive's ``result`` (NULL by default: no table is rewritten), where a subscriber
    with ``results=True`` keeps its handler's return value (see :mod:`sqlmq.results`)."""
    a = schema.archive
    if "result" not in {c["name"] for c in inspect(conn).get_columns(a.name)}:
        conn.execute(AddColumn(a.c.result))


def _v23(conn: Connection, schema: Schema) -> None:
    """Workflows' steps and their dependencies, and the signals messages wait for (new
    tables, and the message table's ``waits_for``, NULL by default: no table is rewritten;
    see :mod:`sqlmq.workflows`)."""
    schema.metadata.create_all(conn, tables=[schema.step, schema.step_need, schema.signal],
                               checkfirst=True)
    m = schema.message
    if "waits_for" not in {c["name"] for c in inspect(conn).get_columns(m.name)}:
        conn.execute(AddColumn(m.c.waits_for))


def _v24(conn: Connection, schema: Schema) -> None:
    """The message table's storage parameters, where the database has them (PostgreSQL's
    fillfactor: see :data:`~sqlmq.schema.MESSAGE_STORAGE`). Pages written from now on
    follow them; the table is not rewritten."""
    m = schema.message
    storage = m.dialect_kwargs.get(f"{conn.dialect.name}_with")
    if storage:
        table = conn.dialect.identifier_preparer.format_table(m)
        settings = ", ".join(f"{k} = {int(v)}" for k, v in storage.items())
        conn.exec_driver_sql(f"ALTER TABLE {table} SET ({settings})")


def _v25(conn: Connection, schema: Schema) -> None:
    """The schedule table's ``paused_at`` (NULL by default: every schedule runs, no table
    is rewritten), set while an operator has paused the schedule (see
    :mod:`sqlmq.schedules`)."""
    s = schema.schedule
    if "paused_at" not in {c["name"] for c in inspect(conn).get_columns(s.name)}:
        conn.execute(AddColumn(s.c.paused_at))


def _v26(conn: Connection, schema: Schema) -> None:
    """The archive's text search index (see :mod:`sqlmq.search`): each database makes its
    own kind (PostgreSQL a GIN index, MariaDB a FULLTEXT one, SQLite an FTS5 table), as
    its engine's :data:`DatabaseSteps`; nothing shared."""


def _partial_anew(conn: Connection, schema: Schema, index: Index) -> None:
    """Make ``index`` anew where its condition leaves out the messages with a
    ``fair_key`` (the condition those migrations changed) and the index there does not
    yet; a database where it is whole (MySQL, MariaDB) or another condition keeps its
    own."""
    key = f"{conn.dialect.name}_where"
    where = index.dialect_kwargs.get(key)
    if where is None or "fair_key" not in str(where):
        return
    present = {ix["name"]: ix for ix in inspect(conn).get_indexes(schema.message.name)}
    if index.name in present:
        if "fair_key" in str(present[index.name].get("dialect_options", {}).get(key, "")):
            return
        index.drop(conn)
    index.create(conn)


def _create_missing(conn: Connection, schema: Schema, *indexes: Index) -> None:
    """Create those of the message table's ``indexes`` it does not have yet (a migration
    looks before it acts, as version 3)."""
    present = _index_names(conn, schema)
    for index in indexes:
        if index.name not in present:
            index.create(conn)


def _index_names(conn: Connection, schema: Schema) -> set[str]:
    """The names of the indexes the message table has now."""
    return {ix["name"] for ix in inspect(conn).get_indexes(schema.message.name)}


class AddColumn(ExecutableDDLElement):
    """``ALTER TABLE … ADD COLUMN`` for a column of sqlmq's tables (SQLAlchemy Core has
    none; the column is rendered by the dialect, as in CREATE TABLE)."""

    def __init__(self, column: Column[Any]) -> None:
        self.column = column


@compiles(AddColumn)
def _add_column(element: AddColumn, compiler: Any, **kw: Any) -> str:
    table = compiler.preparer.format_table(element.column.table)
    return f"ALTER TABLE {table} ADD COLUMN {compiler.process(CreateColumn(element.column))}"


MIGRATIONS: dict[int, Callable[[Connection, Schema], None]] = {
    1: _v1, 2: _v2, 3: _v3, 4: _v4, 5: _v5, 6: _v6, 7: _v7, 8: _v8, 9: _v9, 10: _v10,
    11: _v11, 12: _v12, 13: _v13, 14: _v14, 15: _v15, 16: _v16, 17: _v17, 18: _v18,
    19: _v19, 20: _v20, 21: _v21, 22: _v22, 23: _v23, 24: _v24, 25: _v25, 26: _v26}
assert max(MIGRATIONS) == SCHEMA_VERSION


def current_version(conn: Connection, schema: Schema) -> int:
    if not inspect(conn).has_table(schema.version.name):
        return 0
    return conn.execute(select(func.max(schema.version.c.version))).scalar() or 0


#: What one database does at a version beyond the step every database shares (its
#: engine's, as the text search index of version 26), by version: run after that step, and
#: on a database made at once (:func:`_create`), after its tables.
DatabaseSteps = Mapping[int, Callable[[Connection, Schema], None]]


#: Takes the lock that makes concurrent migrators take turns, in the migrating transaction
#: (each engine knows its database's lock); returns what releases it, where the lock
#: outlives the transaction (MySQL's GET_LOCK), else None.
MigrationLock = Callable[[Connection], "Callable[[], None] | None"]


def _apply(conn: Connection, schema: Schema, lock: MigrationLock | None,
           held: list[Callable[[], None]], own: DatabaseSteps) -> int:
    if lock is not None:
        release = lock(conn)
        if release is not None:
            held.append(release)
    version = current_version(conn, schema)
    steps = sorted(v for v in MIGRATIONS if v > version)
    if not steps:
        return version
    if version == 0 and not _any_table(conn, schema):
        _create(conn, schema)
        for step in steps:
            if step in own:
                own[step](conn, schema)
        _record(conn, schema, steps)
    else:
        for step in steps:
            MIGRATIONS[step](conn, schema)
            if step in own:
                own[step](conn, schema)
            _record(conn, schema, [step])
    return steps[-1]


def _any_table(conn: Connection, schema: Schema) -> bool:
    have = set(inspect(conn).get_table_names())
    return any(table.name in have for table in schema.tables)


def _create(conn: Connection, schema: Schema) -> None:
    """A database with none of the prefix's tables gets the latest schema at once: the
    steps would make the same tables and indexes (version 1 creates the message table as it
    is now), then inspect each of them a dozen times over, which made a fresh schema cost
    twice as much on PostgreSQL (tests make one each). Where any table exists, even from a
    migrator that died half way, the steps run and finish what is missing."""
    schema.metadata.create_all(conn, tables=schema.tables, checkfirst=False)


def _record(conn: Connection, schema: Schema, steps: list[int]) -> None:
    now = datetime.now(UTC)
    conn.execute(schema.version.insert(), [{"version": s, "applied_at": now} for s in steps])


async def migrate(db: AsyncEngine, schema: Schema, lock: MigrationLock | None = None,
                  own: DatabaseSteps | None = None) -> int:
    """Create or upgrade the schema; returns the version now in place. Engines pass their
    database's ``lock`` and ``own`` steps (see
    :meth:`sqlmq.engines.sql.engine.SqlEngine.migrate`).

    A lock that outlives the transaction (MySQL's) is released after the COMMIT, not before:
    a migrator let in between would read the version without this one's last rows (steps
    that ran no DDL leave theirs uncommitted until then), apply those steps again and fail
    on the version's primary key (seen on MariaDB with four migrators)."""
    held: list[Callable[[], None]] = []
    async with db.connect() as conn:
        try:
            async with conn.begin():
                return await conn.run_sync(_apply, schema, lock, held, own or {})
        finally:
            for release in held:
                await conn.run_sync(lambda _conn, release=release: release())


async def check_schema(db: AsyncEngine, schema: Schema, url: str) -> None:
    """Refuse to run on a missing or older schema, with the command that fixes it."""
    async with db.connect() as conn:
        # A read: on SQLite the write lock would hold every command (``dlq watch``, a
        # worker's start) until each open writer, a caller's outbox transaction too, ends.
        await conn.execution_options(**{READ_ONLY: True})
        version = await conn.run_sync(current_version, schema)
    if version == SCHEMA_VERSION:
        return
    if version == 0:
        problem = f"no sqlmq schema (tables {schema.prefix}*) in {url}"
    elif version < SCHEMA_VERSION:
        problem = f"sqlmq schema version {version} in {url}, this sqlmq needs {SCHEMA_VERSION}"
    else:
        raise SchemaError(
            f"sqlmq schema version {version} in {url} is newer than this sqlmq "
            f"({SCHEMA_VERSION}); upgrade the sqlmq package"
        )
    prefix = "" if schema.prefix == "sqlmq_" else f" --prefix {schema.prefix}"
    raise SchemaError(
        f"{problem}: run `sqlmq migrate --url {url}{prefix}` (or `await broker.migrate()`)"
    )
