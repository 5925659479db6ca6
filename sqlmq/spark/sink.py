"""Publishing a DataFrame as messages, all or nothing.

Executors *stage* rows in ``spark_staging`` (tagged with the writer's token and the task
attempt) and return what they staged; the driver's commit moves the staged rows of the
successful attempts into the message table and deletes everything the job staged, in one
transaction. Subscribers see nothing before that commit, a failed job publishes nothing,
and rows of failed or speculative attempts are removed with the rest. A streaming sink also
records each published batch id in ``spark_sink_batch`` in the same transaction, so a batch
Spark replays after a crash is not published twice.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)
from sqlalchemy import delete, insert, literal, select

from ..broker import DEFAULT_MAX_PAYLOAD
from ..codec import BYTES_TYPE, CONTENT_TYPE, TEXT_TYPE
from ..errors import ConfigurationError, PayloadTooLarge, PublishError
from ..schema import MAX_PRIORITY, MIN_PRIORITY
from ..sqltime import db_now_plus
from ..subscriber import check_queue
from .options import Database, Options, queue_option

_NUMBERS = (ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType, DecimalType)
_COLUMNS = {
    "payload": "binary",
    "body": "string",
    "queue": "string",
    "headers": "map<string,string>",
    "delay": "a number of seconds",
    "key": "string",
    "priority": "an integer",
}
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
#: Staged rows older than this belong to jobs that died without an abort; any commit drops them.
STAGING_TTL = 24 * 3600.0


@dataclass(frozen=True)
class SinkOptions:
    db: Database
    queue: str | None
    columns: tuple[str, ...]
    content_type: str
    max_payload_bytes: int
    sink: str | None
    batch_id: int | None = None


def sink_options(opts: Options, schema: StructType, overwrite: bool,
                 stream: bool = False) -> SinkOptions:
    """Check the DataFrame's columns and the options before any task runs."""
    db = Database.from_options(opts)
    if overwrite:
        raise ConfigurationError("the sqlmq sink only appends messages: use mode('append')")
    queue = queue_option(opts, required=False)
    names = [f.name for f in schema.fields]
    for f in schema.fields:
        expected = _COLUMNS.get(f.name)
        if expected is None:
            raise ConfigurationError(
                f"column {f.name!r} is not something the sqlmq sink publishes; it takes "
                f"{', '.join(_COLUMNS)} (select the columns to publish)"
            )
        t = f.dataType
        ok = {
            "payload": isinstance(t, BinaryType),
            "body": isinstance(t, StringType),
            "queue": isinstance(t, StringType),
            "key": isinstance(t, StringType),
            "delay": isinstance(t, _NUMBERS),
            "priority": isinstance(t, _INTEGERS),
            "headers": isinstance(t, MapType) and isinstance(t.keyType, StringType)
            and isinstance(t.valueType, StringType),
        }[f.name]
        if not ok:
            raise ConfigurationError(
                f"column {f.name!r} must be {expected}, got {t.simpleString()}"
            )
    if ("payload" in names) == ("body" in names):
        raise ConfigurationError(
            "the sqlmq sink needs exactly one of a 'payload' (binary) or 'body' (string) column, "
            f"got columns {names}"
        )
    if queue is None and "queue" not in names:
        opts.require("queue", "orders")
    sink = opts.get("sink")
    if stream and sink is None:
        raise ConfigurationError(
            "writeStream to sqlmq needs option('sink', name): a name that stays the same "
            "across restarts, under which published batch ids are recorded"
        )
    if sink is not None:
        check_queue(sink)
    batch_id = None if stream else opts.integer("batchId", None, minimum=0)
    if not stream and (sink is None) != (batch_id is None):
        raise ConfigurationError(
            "a batch write publishes once per batch only with both option('sink', name) and "
            "option('batchId', id) (e.g. foreachBatch's batch id); give both or neither"
        )
    db.check()
    return SinkOptions(
        db=db, queue=queue, columns=tuple(names),
        content_type=opts.get("contentType") or (BYTES_TYPE if "payload" in names else TEXT_TYPE),
        max_payload_bytes=opts.integer("maxPayloadBytes", DEFAULT_MAX_PAYLOAD) or 1,
        sink=sink, batch_id=batch_id,
    )


@dataclass
class Staged(WriterCommitMessage):
    token: str
    attempt: int
    rows: int


def _attempt() -> int:
    from pyspark import TaskContext

    tc = TaskContext.get()
    return tc.taskAttemptId() if tc is not None else uuid.uuid4().int >> 80


def stage(o: SinkOptions, token: str, batches: Iterator[Any]) -> Staged:
    """Validate and stage one task's rows; raising fails the task, and so the job."""
    attempt = _attempt()
    total = 0
    for batch in batches:
        rows = _messages(o, batch)
        if rows:
            o.db.ledger().insert_staged(token, attempt, rows)
        total += len(rows)
    return Staged(token, attempt, total)


def _column(batch: Any, name: str, kind: Any = None) -> list[Any] | None:
    if name not in batch.schema.names:
        return None
    column = batch.column(name)
    return (column if kind is None else column.cast(kind)).to_pylist()


def _messages(o: SinkOptions, batch: Any) -> list[tuple]:
    """``(queue, headers JSON, payload, delay, priority)`` per row, checked column by column: the
    per-row Python work is most of a write's cost, so what is the same for every row (the
    default queue, headers without a headers or key column) is worked out once."""
    import pyarrow as pa

    n = batch.num_rows
    queues = _column(batch, "queue")
    if queues is None:
        if o.queue is None:
            raise PublishError("row 0 has no queue and option 'queue' is not set")
        queues = [o.queue] * n
    else:
        if o.queue is not None:
            queues = [o.queue if q is None else q for q in queues]
        elif None in queues:
            raise PublishError(f"row {queues.index(None)} has no queue and option 'queue' "
                               "is not set")
        for q in set(queues):
            check_queue(q)
    # Arrow strings are valid UTF-8: casting to binary gives their bytes, as encode() would.
    payloads = _column(batch, "payload")
    if payloads is None:
        payloads = _column(batch, "body", pa.binary())
    assert payloads is not None
    if None in payloads:
        i = payloads.index(None)
        raise PublishError(f"row {i} for queue {queues[i]!r} has a null payload/body")
    limit = o.max_payload_bytes
    if n and max(map(len, payloads)) > limit:
        i, size = next((i, len(p)) for i, p in enumerate(payloads) if len(p) > limit)
        raise PayloadTooLarge(f"payload of {size} bytes for queue {queues[i]!r} exceeds "
                              f"maxPayloadBytes ({limit})")
    headers = _column(batch, "headers")
    keys = _column(batch, "key")
    if headers is None and keys is None:
        texts = [json.dumps({CONTENT_TYPE: o.content_type}, ensure_ascii=False)] * n
    else:
        texts = [_header_text(o, i, headers[i] if headers else None, keys[i] if keys else None)
                 for i in range(n)]
    delays = _column(batch, "delay")
    if delays is None:
        seconds = [0.0] * n
    else:
        seconds = [0.0 if d is None else float(d) for d in delays]
        for i, d in enumerate(seconds):
            if math.isnan(d) or math.isinf(d) or d < 0:
                raise PublishError(f"row {i}: delay must be finite and not negative, got {d}")
    return list(zip(queues, texts, payloads, seconds, _priorities(batch, n), strict=True))


def _priorities(batch: Any, n: int) -> list[int]:
    """The ``priority`` column (null: 0), each in the range ``publish(priority=)`` takes."""
    column = _column(batch, "priority")
    if column is None:
        return [0] * n
    out = [0 if p is None else p for p in column]
    if n and not MIN_PRIORITY <= min(out) <= max(out) <= MAX_PRIORITY:
        i, p = next((i, p) for i, p in enumerate(out) if not MIN_PRIORITY <= p <= MAX_PRIORITY)
        raise PublishError(f"row {i}: priority must be from {MIN_PRIORITY} to {MAX_PRIORITY}, "
                           f"got {p}")
    return out


def _header_text(o: SinkOptions, i: int, pairs: Any, key: str | None) -> str:
    h = dict(pairs or ())
    if any(not k or v is None for k, v in h.items()):
        raise PublishError(f"row {i}: header names must be non-empty and values non-null")
    h.setdefault(CONTENT_TYPE, o.content_type)
    if key is not None:
        h["key"] = key
    return json.dumps(h, ensure_ascii=False)


def publish(db: Database, staged: list[Staged | None], tokens: set[str],
            sink: str | None = None, batch_id: int | None = None) -> int:
    """Move the staged rows of successful attempts to the message table (waking subscribers
    as any publish does) and drop everything the job staged, in one transaction. Returns
    how many messages were published."""
    s = db.schema
    st, sb = s.spark_staging, s.spark_sink_batch
    attempts = sorted({x.attempt for x in staged if x is not None})
    expected = sum(x.rows for x in staged if x is not None)
    published = 0
    with db.sql_engine().begin() as conn:
        done = False
        if sink is not None:
            done = conn.execute(
                select(sb.c.batch_id).where(sb.c.sink == sink, sb.c.batch_id == batch_id)
            ).first() is not None
            if not done:
                conn.execute(insert(sb).values(sink=sink, batch_id=batch_id,
                                               committed_at=db_now_plus(literal(0.0))))
        if not done and attempts:
            published = db.ledger().publish_staged(conn, sorted(tokens), attempts)
            if published != expected:
                # Rolls the whole commit back: a task's staged rows went missing (deleted
                # by hand, or lost with the server), so publishing would lose messages.
                raise PublishError(
                    f"the job's tasks staged {expected} rows but {published} are in "
                    f"{st.name}: nothing published; run the job again"
                )
        discard(conn, db, tokens)
    return published


def discard(conn: Any, db: Database, tokens: set[str]) -> None:
    st = db.schema.spark_staging
    if tokens:
        conn.execute(delete(st).where(st.c.token.in_(sorted(tokens))))
    conn.execute(delete(st).where(st.c.staged_at < db_now_plus(literal(-STAGING_TTL))))


#: When Spark aborts a job after one task failed, other tasks of the job may still be
#: staging; the abort sweeps their rows again at these delays (seconds from the abort).
ABORT_SWEEPS = (0.0, 0.5, 1.5, 3.5)


def _abort(db: Database, tokens: set[str]) -> None:
    start = time.monotonic()
    for at in ABORT_SWEEPS:
        time.sleep(max(0.0, start + at - time.monotonic()))
        with db.sql_engine().begin() as conn:
            discard(conn, db, tokens)


class BatchSink(DataSourceArrowWriter):
    """``df.write.format("sqlmq")``: one token for the job, published in the driver commit.

    With options ``sink`` and ``batchId`` (from ``foreachBatch``) a batch id is published
    once, like the streaming sink's.
    """

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.token = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return stage(self.options, self.token, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        o = self.options
        publish(o.db, _staged(messages), {self.token}, sink=o.sink, batch_id=o.batch_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.options.db, {self.token})


class StreamSink(DataSourceStreamArrowWriter):
    """``writeStream.format("sqlmq")``: each micro-batch published once per batch id.

    Spark builds a new writer for every batch and another for its commit, so the token of a
    batch's staged rows travels in the commit messages.
    """

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.token = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return stage(self.options, self.token, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staged = _staged(messages)
        publish(self.options.db, staged, {x.token for x in staged if x is not None},
                sink=self.options.sink, batch_id=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.options.db, {x.token for x in _staged(messages) if x is not None})


def _staged(messages: list[WriterCommitMessage | None]) -> list[Staged | None]:
    return [m if isinstance(m, Staged) else None for m in messages]


