"""The ``sqlmq`` data source: batch reads of the live queue or the archive, split by id range
and filtered in SQL, plus the entry points of the stream reader and the sinks.

Register it once per session: ``spark.dataSource.register(SqlmqDataSource)`` (or
:func:`sqlmq.spark.register`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
)
from sqlalchemy import and_, func, select

from ..errors import ConfigurationError
from .columns import ARCHIVE_COLUMNS, DB_NAMES, MESSAGE_COLUMNS, db_columns, ddl, record_batches
from .options import TABLES, Database, Options, check_queue_known, queue_option

# Columns whose filters are applied in SQL; Spark re-checks nothing we accept.
_PUSHABLE = {"id", "queue", "state", "attempts", "deliveries", "created_at", "first_attempt_at",
             "last_attempt_at", "next_attempt_at", "archived_at"}
_OPS = {EqualTo: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<",
        LessThanOrEqual: "<="}

Condition = tuple[str, str, Any]  # (spark column, operator, value): picklable


def table_option(opts: Options) -> str:
    table = (opts.get("table", "message") or "message").lower()
    if table == "queue":
        table = "message"
    if table not in TABLES:
        raise ConfigurationError(
            f"unknown table {table!r}: option 'table' is 'message' (the live queue, default) "
            "or 'archive'"
        )
    return table


class SqlmqDataSource(DataSource):
    """``format("sqlmq")``: read a queue or the archive, consume a queue as a stream, and
    publish DataFrames as messages. See docs/spark.md for every option."""

    @classmethod
    def name(cls) -> str:
        return "sqlmq"

    def schema(self) -> str:
        opts = Options(self.options, "spark.read.format('sqlmq')")
        db = Database.from_options(opts)
        table = table_option(opts)
        queue_option(opts, required=False)
        db.check()
        return ddl(ARCHIVE_COLUMNS if table == "archive" else MESSAGE_COLUMNS)

    def reader(self, schema: Any) -> DataSourceReader:
        opts = Options(self.options, "spark.read.format('sqlmq')")
        db = Database.from_options(opts)
        table = table_option(opts)
        queue = queue_option(opts, required=False)
        if queue is not None:
            check_queue_known(db, queue)
        return TableReader(db, table, queue, opts.integer("numPartitions", None))

    def streamReader(self, schema: Any) -> Any:
        from .stream import QueueStreamReader, stream_options

        return QueueStreamReader(stream_options(Options(self.options, "readStream sqlmq")))

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from .sink import BatchSink, sink_options

        return BatchSink(sink_options(Options(self.options, "df.write sqlmq"), schema, overwrite))

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from .sink import StreamSink, sink_options

        opts = Options(self.options, "writeStream sqlmq")
        return StreamSink(sink_options(opts, schema, overwrite, stream=True))


@dataclass
class IdRange(InputPartition):
    """Ids ``lo..hi`` (inclusive) of one table, with the pushed-down conditions."""

    lo: int
    hi: int
    where: list[Condition] = field(default_factory=list)

    def __post_init__(self) -> None:
        InputPartition.__init__(self, (self.lo, self.hi))


class TableReader(DataSourceReader):
    """A batch read of the message or archive table, one partition per id range."""

    def __init__(self, db: Database, table: str, queue: str | None,
                 num_partitions: int | None) -> None:
        self.db = db
        self.table = table
        self.columns = ARCHIVE_COLUMNS if table == "archive" else MESSAGE_COLUMNS
        self.where: list[Condition] = [] if queue is None else [("queue", "=", queue)]
        self.num_partitions = num_partitions

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        names = {n for n, _ in self.columns}
        for f in filters:
            column = f.attribute[0] if len(f.attribute) == 1 else None
            if column not in _PUSHABLE or column not in names:
                yield f
            elif isinstance(f, IsNull | IsNotNull):
                self.where.append((column, "null" if isinstance(f, IsNull) else "not null", None))
            elif isinstance(f, In):
                self.where.append((column, "in", [_sql_value(v) for v in f.value]))
            elif type(f) in _OPS and f.value is not None:
                self.where.append((column, _OPS[type(f)], _sql_value(f.value)))
            else:
                yield f

    def _table(self) -> Any:
        s = self.db.schema
        return s.archive if self.table == "archive" else s.message

    def partitions(self) -> Sequence[InputPartition]:
        t = self._table()
        with self.db.sql_engine().connect() as conn:
            lo, hi, n = conn.execute(
                select(func.min(t.c.id), func.max(t.c.id), func.count())
                .where(*conditions(t, self.where))
            ).one()
        if not n:
            return [IdRange(0, -1, self.where)]
        parts = self.num_partitions or max(1, min(64, n // 50_000 + 1))
        step = max(1, -(-(hi - lo + 1) // parts))
        return [IdRange(a, min(hi, a + step - 1), self.where) for a in range(lo, hi + 1, step)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, IdRange)
        if partition.hi < partition.lo:
            return
        t = self._table()
        ledger = self.db.ledger()
        stmt = (
            select(*db_columns(t, self.columns, ledger.timestamp))
            .where(t.c.id.between(partition.lo, partition.hi), *conditions(t, partition.where))
            .order_by(t.c.id)
        )
        with ledger.sql_engine.connect() as conn:
            result = conn.execution_options(yield_per=10_000).execute(stmt)
            yield from record_batches(result, self.columns)


def conditions(table: Any, where: list[Condition]) -> list[Any]:
    out = []
    for name, op, value in where:
        col = table.c[DB_NAMES.get(name, name)]
        if op == "in":
            out.append(col.in_(value))
        elif op == "null":
            out.append(col.is_(None))
        elif op == "not null":
            out.append(col.is_not(None))
        else:
            out.append(col.operate(_OPERATORS[op], value))
    return [and_(*out)] if out else []


def _sql_value(value: Any) -> Any:
    # Spark hands timestamps over as naive local time (datetime.fromtimestamp).
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.astimezone(UTC)
    return value


def _operators() -> dict[str, Any]:
    import operator

    return {"=": operator.eq, ">": operator.gt, ">=": operator.ge, "<": operator.lt,
            "<=": operator.le}


_OPERATORS = _operators()
