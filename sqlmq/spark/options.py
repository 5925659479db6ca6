"""Options of the ``sqlmq`` Spark format, checked on the driver before any job runs, and the
database connections the source and sink use (one sync engine per URL and process).

Executors and the driver's Python processes are separate interpreters: everything here is
rebuilt from the option strings, never shipped as live objects.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Engine as SyncEngine

from ..connect import parse_url, safe_url, sync_url
from ..engines import create_sync
from ..engines.spark import SparkLedger, ledger_for
from ..errors import ConfigurationError, SchemaError
from ..migrate import current_version
from ..schema import DEFAULT_PREFIX, SCHEMA_VERSION, Schema, build_schema
from ..subscriber import check_queue

TABLES = ("message", "archive")

_engines: dict[tuple[int, str], SyncEngine] = {}
_ledgers: dict[tuple[int, str, str], SparkLedger] = {}


class Options:
    """Case-insensitive option reading with errors that name the option and the fix."""

    def __init__(self, raw: Mapping[str, str], what: str) -> None:
        self.raw = {k.lower(): v for k, v in raw.items()}
        self.what = what

    def get(self, name: str, default: str | None = None) -> str | None:
        value = self.raw.get(name.lower())
        return default if value is None or value == "" else value

    def require(self, name: str, example: str) -> str:
        value = self.get(name)
        if value is None:
            raise ConfigurationError(
                f"{self.what} needs option {name!r}, e.g. .option({name!r}, {example!r})"
            )
        return value

    def integer(self, name: str, default: int | None, minimum: int = 1) -> int | None:
        value = self.get(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ConfigurationError(f"option {name!r} must be an integer, got {value!r}") from None
        if number < minimum:
            raise ConfigurationError(f"option {name!r} must be at least {minimum}, got {number}")
        return number

    def seconds(self, name: str, default: float) -> float:
        value = self.get(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ConfigurationError(
                f"option {name!r} must be a number of seconds, got {value!r}"
            ) from None
        if not number > 0:
            raise ConfigurationError(f"option {name!r} must be positive, got {value!r}")
        return number


@dataclass(frozen=True)
class Database:
    """Where the tables are: a URL and a table prefix. Picklable; connects lazily."""

    url: str
    prefix: str = DEFAULT_PREFIX

    @classmethod
    def from_options(cls, opts: Options) -> Database:
        url = opts.require("url", "postgresql://user@host/db")
        parse_url(url)  # a clear error for a malformed or unsupported URL
        prefix = opts.get("prefix", DEFAULT_PREFIX) or DEFAULT_PREFIX
        build_schema(prefix)  # validates the prefix
        return cls(url, prefix)

    @property
    def schema(self) -> Schema:
        return _schema(self.prefix)

    @property
    def shown(self) -> str:
        return safe_url(self.url)

    def sql_engine(self) -> SyncEngine:
        """The synchronous SQLAlchemy engine of this URL (one per process)."""
        key = (os.getpid(), self.url)
        engine = _engines.get(key)
        if engine is None:
            engine = create_sync(sync_url(parse_url(self.url)))
            _engines[key] = engine
        return engine

    def ledger(self) -> SparkLedger:
        """The Spark bookkeeping of this database and prefix (one per process)."""
        key = (os.getpid(), self.url, self.prefix)
        ledger = _ledgers.get(key)
        if ledger is None:
            ledger = _ledgers[key] = ledger_for(self.sql_engine(), self.schema)
        return ledger

    def check(self) -> None:
        """Refuse a database without the sqlmq tables (or an older schema), naming the fix."""
        try:
            with self.sql_engine().connect() as conn:
                version = current_version(conn, self.schema)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise ConfigurationError(f"cannot connect to {self.shown}: {exc}") from None
        if version < SCHEMA_VERSION:
            extra = "" if self.prefix == DEFAULT_PREFIX else f" --prefix {self.prefix}"
            found = "no sqlmq tables" if version == 0 else f"sqlmq schema version {version}"
            raise SchemaError(
                f"{found} (prefix {self.prefix!r}) in {self.shown}; the Spark source needs "
                f"version {SCHEMA_VERSION}: run `sqlmq migrate --url {self.shown}{extra}`"
            )

    def known_queues(self) -> set[str]:
        s = self.schema
        with self.sql_engine().connect() as conn:
            live = conn.execute(select(s.message.c.queue).distinct()).scalars().all()
            done = conn.execute(select(s.archive.c.queue).distinct()).scalars().all()
        return set(live) | set(done)

    def now(self) -> Any:
        from sqlalchemy import literal

        from ..sqltime import db_now_plus

        with self.sql_engine().connect() as conn:
            return conn.execute(select(db_now_plus(literal(0.0)))).scalar_one()


_schemas: dict[str, Schema] = {}


def _schema(prefix: str) -> Schema:
    if prefix not in _schemas:
        _schemas[prefix] = build_schema(prefix)
    return _schemas[prefix]


def queue_option(opts: Options, required: bool) -> str | None:
    queue = opts.get("queue")
    if queue is None:
        if required:
            opts.require("queue", "orders")
        return None
    try:
        return check_queue(queue)
    except ConfigurationError as exc:
        raise ConfigurationError(f"option 'queue': {exc}") from None


def check_queue_known(db: Database, queue: str) -> None:
    known = db.known_queues()
    if queue not in known:
        listed = ", ".join(sorted(known)[:20]) or "none"
        raise ConfigurationError(
            f"unknown queue {queue!r}: no message of it in {db.schema.message.name} or "
            f"{db.schema.archive.name} at {db.shown} (queues there: {listed})"
        )


def count(conn: Any, table: Any, *where: Any) -> int:
    return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


#: Default most rows per partition of a micro-batch. Each Spark task has a fixed cost far
#: above reading a few thousand rows: at local[2], 50,000-row batches ran about twice as
#: fast in two partitions as in five.
ROWS_PER_PARTITION = 25_000


@dataclass(frozen=True)
class StreamOptions:
    """A stream reader's options, checked (see :func:`stream_options`)."""

    db: Database
    queue: str
    consumer: str
    max_per_batch: int | None
    lease: float
    consumer_timeout: float
    rows_per_partition: int


def stream_options(opts: Options) -> StreamOptions:
    db = Database.from_options(opts)
    queue = queue_option(opts, required=True)
    assert queue is not None
    consumer = opts.require("consumer", "orders-to-parquet")
    try:
        check_queue(consumer)
    except ConfigurationError as exc:
        raise ConfigurationError(f"option 'consumer': {exc}") from None
    if (opts.get("table") or "message").lower() not in ("message", "queue"):
        raise ConfigurationError(
            "a stream consumes the live queue; option 'table' = 'archive' is for batch reads"
        )
    timeout = opts.seconds("consumerTimeout", 30.0)
    lease = opts.seconds("leaseSeconds", 600.0)
    if lease < 3 * timeout:
        raise ConfigurationError(
            f"option 'leaseSeconds' ({lease:g}) must be at least 3 x 'consumerTimeout' "
            f"({timeout:g}) so that leases outlive a restart"
        )
    db.check()
    return StreamOptions(
        db=db, queue=queue, consumer=consumer,
        max_per_batch=opts.integer("maxMessagesPerBatch", 10_000),
        lease=lease, consumer_timeout=timeout,
        rows_per_partition=opts.integer("rowsPerPartition", ROWS_PER_PARTITION)
        or ROWS_PER_PARTITION,
    )
