"""A stand-in for Spark's micro-batch engine around the sqlmq stream reader, for crash tests.

It calls :class:`sqlmq.spark.stream.QueueStreamReader` in the order Spark's
``MicroBatchExecution`` does under ``trigger(availableNow=True)``, with the checkpoint (offset
log, commit log) in small files and an idempotent sink (one file per batch id, replaced when
the batch is replayed), and without a JVM, so a test can SIGKILL it at any named point
(``SQLMQ_TEST_FAULT``, see :mod:`sqlmq.spark.faults`) in a few seconds:

- on start, an offset logged but not committed is replayed: ``partitions(start, end)`` of
  the logged offsets, with no ``latestOffset`` before it;
- then per batch: ``latestOffset(start)``, the offset log entry, ``commit(start)``, the
  batch (``partitions`` and ``read``), the sink, the commit log entry; it stops when
  ``latestOffset`` returns ``start``.

Two points of its own mark Spark's windows: ``spark:planned`` (an offset returned, not yet
logged, its lease ahead committed) and ``spark:written`` (the sink written, the commit log
not). Run: ``python -m tests.spark.microbatch URL PREFIX CHECKPOINT_DIR OUT_DIR``, or
``--serve`` to fork a driver per request (see :func:`serve`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.datasource import ReadMaxRows

from sqlmq.spark.faults import fault
from sqlmq.spark.options import Options
from sqlmq.spark.stream import QueueStreamReader, stream_options

QUEUE = "in"
CONSUMER = "pipe"
PER_BATCH = 5
CONSUMER_TIMEOUT = 1.0


def reader_for(url: str, prefix: str) -> QueueStreamReader:
    opts = Options({"url": url, "prefix": prefix, "queue": QUEUE, "consumer": CONSUMER,
                    "maxMessagesPerBatch": str(PER_BATCH),
                    "consumerTimeout": str(CONSUMER_TIMEOUT), "leaseSeconds": "600"},
                   "test")
    return QueueStreamReader(stream_options(opts))


class Checkpoint:
    """The offset and commit logs: one file per batch id each, written atomically."""

    def __init__(self, path: Path) -> None:
        self.offsets = path / "offsets"
        self.commits = path / "commits"
        self.offsets.mkdir(parents=True, exist_ok=True)
        self.commits.mkdir(parents=True, exist_ok=True)

    def last_batch(self) -> int | None:
        ids = [int(p.name) for p in self.offsets.iterdir() if p.name.isdigit()]
        return max(ids, default=None)

    def offset(self, batch: int) -> dict:
        return json.loads((self.offsets / str(batch)).read_text())

    def committed(self, batch: int) -> bool:
        return (self.commits / str(batch)).exists()

    def log_offset(self, batch: int, end: dict) -> None:
        _write(self.offsets / str(batch), json.dumps(end))

    def log_commit(self, batch: int) -> None:
        _write(self.commits / str(batch), "{}")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_batch(reader: QueueStreamReader, ck: Checkpoint, out: Path, batch: int,
              start: dict, end: dict) -> None:
    ids: list[int] = []
    for part in reader.partitions(start, end):
        for records in reader.read(part):
            ids += records.column("id").to_pylist()
    _write(out / f"batch-{batch}", json.dumps(ids))  # the sink: a replay replaces it
    fault("spark:written")
    ck.log_commit(batch)


def run(url: str, prefix: str, ck_dir: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ck = Checkpoint(ck_dir)
    reader = reader_for(url, prefix)
    reader.prepareForTriggerAvailableNow()
    batch = ck.last_batch()
    if batch is not None and not ck.committed(batch):
        begin = ck.offset(batch - 1) if batch > 0 else reader.initialOffset()
        run_batch(reader, ck, out, batch, begin, ck.offset(batch))
    start = reader.initialOffset() if batch is None else ck.offset(batch)
    batch = -1 if batch is None else batch
    while True:
        end = reader.latestOffset(start, ReadMaxRows(PER_BATCH))
        if end == start:
            break
        _wait_ahead(reader)
        fault("spark:planned")
        batch += 1
        ck.log_offset(batch, end)
        reader.commit(start)
        run_batch(reader, ck, out, batch, start, end)
        start = end
    reader.stop()


def _wait_ahead(reader: QueueStreamReader) -> None:
    """Let the lease ahead finish, so that ``spark:planned`` finds it committed."""
    ahead: Any = reader.consumer.ahead
    if ahead is not None:
        ahead.exception()


PRELOAD = ("pandas", "pyarrow", "pyarrow.pandas_compat",
           "sqlalchemy.dialects.postgresql.asyncpg", "sqlalchemy.dialects.postgresql.psycopg",
           "sqlalchemy.dialects.mysql.asyncmy", "sqlalchemy.dialects.mysql.pymysql",
           "sqlalchemy.dialects.sqlite.aiosqlite", "sqlalchemy.dialects.sqlite.pysqlite")


def serve() -> None:
    """Fork one driver per request, with pyspark and sqlmq already imported (importing them
    costs each fresh interpreter over two seconds, most of a crash case). This process has
    no threads and no connections, so a fork inherits nothing half-held.

    A request is one JSON line on stdin, ``[url, prefix, checkpoint, out, log, fault]``;
    the answer one line on stdout: the driver's exit code, negative for a signal (-9 for a
    fault point's SIGKILL)."""
    import importlib
    import traceback

    from sqlmq.spark import faults

    for module in PRELOAD:  # what a driver run imports on first use (pandas alone: ~1.3 s)
        importlib.import_module(module)

    for line in sys.stdin:
        url, prefix, ck_dir, out, log, point = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the driver
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            faults.FAULT = point
            code = 0
            try:
                run(url, prefix, Path(ck_dir), Path(out))
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        run(sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
