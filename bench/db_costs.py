"""What a drain costs PostgreSQL, read from outside the system under test: a database of its
own for each run, the CPU of that database's server processes, the WAL written, and the row
writes its tables counted.

The server is shared (other work, tests, may run on it), so each cost is taken where it can
be told apart: CPU only from the backends and autovacuum workers of the run's own database
(named in their process titles, read from ``/proc``; the WAL writer, checkpointer and
background writer serve every database and are left out); row writes from that database's
``pg_stat_user_tables``. The WAL position is the whole cluster's: ``pg_current_wal_lsn()``
counts everyone's records, so :func:`own_wal` also reads the range back with ``pg_waldump``
and keeps the records of the run's database and of the transactions that wrote to it.
"""

from __future__ import annotations

import contextlib
import glob
import multiprocessing
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from .common import PG_URL

TICK = os.sysconf("SC_CLK_TCK")
#: How often the CPU sampler reads the processes: a backend that exits between two reads
#: loses at most this much of its CPU (the drains keep their connections to the end, but
#: PGQueuer's).
SAMPLE_EVERY = 0.05


def admin_url(database: str | None = None) -> str:
    """:data:`PG_URL` as a libpq URL (no SQLAlchemy driver), on ``database`` if given."""
    parts = urlsplit(re.sub(r"^postgresql\+\w+://", "postgresql://", PG_URL))
    if database is not None:
        parts = parts._replace(path=f"/{database}")
    return urlunsplit(parts)


def sql(query: str, database: str | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_url(database), autocommit=True) as conn:
        cur = conn.execute(query)
        return cur.fetchall() if cur.description else []


@contextlib.contextmanager
def fresh_database(name: str) -> Iterator[str]:
    """A new, empty database ``name`` for one run, dropped after (and first, if a run was cut
    short); yields its libpq URL."""
    sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    sql(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url(name)
    finally:
        sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postmaster_pid() -> int:
    """The parent of a backend, read while its connection is open (closed, the backend
    may be gone before its /proc entry is read)."""
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone() or (0,)
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])


def _ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children(parent: int) -> list[int]:
    try:
        with open(f"/proc/{parent}/task/{parent}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:  # no children file: scan every process
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                            out.append(int(entry))
                except OSError:
                    continue
        return out


class DatabaseCpu:
    """CPU seconds of the server processes working in one database, between :meth:`start`
    and :meth:`stop`: its backends and autovacuum workers, found by their process title
    (``postgres: …: USER DATABASE HOST`` / ``autovacuum worker DATABASE``) and read every
    :data:`SAMPLE_EVERY` seconds by a process of its own (a thread would take the GIL from
    sqlmq's drain, which runs in the benchmark's process)."""

    def __init__(self, database: str) -> None:
        self.database = database
        self._conn: Any = None
        self._proc: Any = None
        self._first: dict[int, int] = {}

    def start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_sampler, args=(self.database, postmaster_pid(), child),
                                 daemon=True)
        self._proc.start()
        self._first = self._conn.recv()

    def stop(self) -> float:
        self._conn.send("stop")
        last: dict[int, int] = self._conn.recv()
        self._proc.join()
        ticks = sum(t - self._first.get(pid, 0) for pid, t in last.items())
        return ticks / TICK


def _sampler(database: str, postmaster: int, conn: Any) -> None:
    pattern = re.compile(rf"(?: \S+ {re.escape(database)} | autovacuum worker "
                         rf"{re.escape(database)}$)")

    def sample() -> dict[int, int]:
        got = {}
        for pid in _children(postmaster):
            if pattern.search(_title(pid).strip()):
                ticks = _ticks(pid)
                if ticks is not None:
                    got[pid] = ticks
        return got

    last = sample()
    conn.send(last)
    while not conn.poll(SAMPLE_EVERY):
        last.update(sample())
    conn.recv()
    last.update(sample())
    conn.send(last)


def wal_lsn() -> str:
    return sql("SELECT pg_current_wal_lsn()::text")[0][0]


def wal_bytes(start: str, end: str) -> int:
    return int(sql(f"SELECT pg_wal_lsn_diff('{end}', '{start}')")[0][0])


def row_writes(database: str) -> dict[str, int]:
    """Rows inserted, updated (HOT included) and deleted in ``database``'s tables so far, by
    the statistics its backends reported (a backend reports at exit, or a second after its
    last report)."""
    rows = sql("SELECT coalesce(sum(n_tup_ins), 0), "
               "coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_del), 0) "
               "FROM pg_stat_user_tables", database)
    ins, upd, dele = (int(x) for x in rows[0])
    return {"ins": ins, "upd": upd, "del": dele}


# ---- the run's own WAL, by pg_waldump -------------------------------------------------------

@contextlib.contextmanager
def wal_kept(name: str) -> Iterator[None]:
    """A physical replication slot that keeps the WAL written meanwhile on disk until it is
    read back (a checkpoint would otherwise recycle the segments)."""
    sql(f"SELECT pg_drop_replication_slot('{name}') FROM pg_replication_slots "
        f"WHERE slot_name = '{name}'")
    sql(f"SELECT pg_create_physical_replication_slot('{name}', true)")
    try:
        yield
    finally:
        sql(f"SELECT pg_drop_replication_slot('{name}')")


def waldump_binary() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_waldump"))
    if not found:
        raise RuntimeError("pg_waldump not found under /usr/lib/postgresql/*/bin/")
    return found[-1]


_RECORD = re.compile(r"^rmgr: (\S+)\s+len \(rec/tot\):\s*(\d+)/\s*(\d+), tx:\s*(\d+), "
                     r"lsn: \S+, prev \S+, desc: (\S+)(.*)$")
_BLOCK = re.compile(r"blkref #\d+: rel (\d+)/(\d+)/(\d+)(?: fork (\w+))? blk \d+( FPW)?")


@dataclass
class OwnWal:
    """The records of one database's run: bytes in all, by record type, by relation, and
    those of the records that carry a full-page image (``fpw_bytes``, the whole record)."""

    bytes: int = 0
    records: int = 0
    by_type: Counter[str] = field(default_factory=Counter)
    count_by_type: Counter[str] = field(default_factory=Counter)
    by_relation: Counter[str] = field(default_factory=Counter)
    fpw_bytes: int = 0


def own_wal(start: str, end: str, database: str) -> OwnWal:
    """The WAL between ``start`` and ``end`` written for ``database``: the records touching
    its blocks, and every record (commits included) of a transaction that wrote any. A
    record touching several relations counts toward the first (``by_relation`` names them
    as ``pg_class`` has them while the database exists)."""
    (oid,) = sql(f"SELECT oid FROM pg_database WHERE datname = '{database}'")[0]
    (datadir,) = sql("SHOW data_directory")[0]
    names = dict(sql("SELECT pg_relation_filenode(oid)::text, relname FROM pg_class "
                     "WHERE pg_relation_filenode(oid) IS NOT NULL", database))
    out = subprocess.run([waldump_binary(), "-p", f"{datadir}/pg_wal", "-s", start, "-e", end],
                         capture_output=True, text=True, check=False)
    parsed = []
    mine: set[str] = set()
    for line in out.stdout.splitlines():
        m = _RECORD.match(line)
        if m is None:
            continue
        rmgr, _rec, tot, tx, desc, rest = m.groups()
        blocks = _BLOCK.findall(rest)
        in_db = [b for b in blocks if b[1] == str(oid)]
        if in_db and tx != "0":
            mine.add(tx)
        parsed.append((rmgr, int(tot), tx, desc, in_db, rest))
    got = OwnWal()
    for rmgr, tot, tx, desc, in_db, rest in parsed:
        if not in_db and (tx == "0" or tx not in mine):
            continue
        kind = f"{rmgr}/{desc}"
        got.bytes += tot
        got.records += 1
        got.by_type[kind] += tot
        got.count_by_type[kind] += 1
        if in_db:
            rel = names.get(in_db[0][2], in_db[0][2])
            fork = in_db[0][3]
            got.by_relation[f"{rel} ({fork})" if fork else rel] += tot
            if " FPW" in rest:
                got.fpw_bytes += tot
        else:
            got.by_relation["(no block: commit, ...)"] += tot
    return got


def pause_for_stats() -> None:
    """Long enough for the backends that just ended to have reported their counts."""
    time.sleep(1.2)
