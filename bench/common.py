"""What every benchmark shares: database URLs, the bench's own table prefix, payloads,
subprocesses, and the figures table."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine

from sqlmq import Broker, build_schema
from sqlmq.connect import parse_url, sync_url

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PEER_PYTHON = BENCH / ".venv-pgqueuer" / "bin" / "python"
PEER_SCRIPT = BENCH / "peer_pgqueuer.py"

PG_URL = os.environ.get("SQLMQ_BENCH_POSTGRES_URL",
                        os.environ.get("SQLMQ_TEST_POSTGRES_URL",
                                       "postgresql://postgres@127.0.0.1:5432/test"))
MYSQL_URL = os.environ.get("SQLMQ_BENCH_MYSQL_URL",
                           os.environ.get("SQLMQ_TEST_MYSQL_URL",
                                          "mariadb://root@127.0.0.1:3306/test"))
DATABASES = ("postgresql", "mariadb", "sqlite")

#: Every table the bench makes starts with this (plus the pid), and is dropped after.
PREFIX = f"bench{os.getpid()}_"
PEER_PREFIX = f"benchpgq{os.getpid()}_"
QUEUE = "bench"
PAYLOAD = b"x" * 64

_sqlite_dir: str | None = None


def url_for(db: str) -> str:
    global _sqlite_dir
    if db == "postgresql":
        return PG_URL
    if db == "mariadb":
        return MYSQL_URL
    if _sqlite_dir is None:
        _sqlite_dir = tempfile.mkdtemp(prefix="sqlmq-bench-")
        atexit.register(shutil.rmtree, _sqlite_dir, ignore_errors=True)
    return f"sqlite:///{_sqlite_dir}/bench.db"


def drop_tables(url: str, prefix: str = PREFIX) -> None:
    engine = create_engine(sync_url(parse_url(url)))
    try:
        build_schema(prefix).metadata.drop_all(engine)
    finally:
        engine.dispose()
    if url.startswith("sqlite:///"):
        for suffix in ("", "-wal", "-shm"):
            Path(url[len("sqlite:///"):] + suffix).unlink(missing_ok=True)


async def fresh_broker(db: str, **options: Any) -> Broker:
    """A broker on freshly migrated bench tables (dropped first if a run was cut short)."""
    url = url_for(db)
    drop_tables(url)
    broker = Broker(url, table_prefix=PREFIX, **options)
    await broker.migrate()
    return broker


@contextlib.asynccontextmanager
async def bench_broker(db: str, **options: Any) -> AsyncIterator[Broker]:
    """:func:`fresh_broker` for one case: closed, and its tables dropped, afterwards."""
    broker = await fresh_broker(db, **options)
    try:
        yield broker
    finally:
        await broker.close()
        drop_tables(url_for(db))


def peer_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PGQUEUER_PREFIX"] = PEER_PREFIX
    env["BENCH_PG_DSN"] = PG_URL
    return env


def peer(*args: object, timeout: float = 1800) -> dict[str, Any]:
    """Run one role of the PGQueuer script in the benchmark's own venv; its JSON answer."""
    if not PEER_PYTHON.exists():
        raise SystemExit("PGQueuer is not installed for the benchmark: run bench/setup.sh")
    out = subprocess.run(
        [str(PEER_PYTHON), str(PEER_SCRIPT), *map(str, args)], env=peer_env(),
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"pgqueuer {args[0]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def fresh_peer_schema() -> None:
    """Drop PGQueuer's tables if a previous run left them, and install them anew."""
    try:
        peer("uninstall")
    except RuntimeError:
        pass
    peer("install")


def spawn(args: Sequence[str], peer_side: bool = False) -> subprocess.Popen[str]:
    if peer_side:
        cmd = [str(PEER_PYTHON), str(PEER_SCRIPT), *args]
        env = peer_env()
    else:
        cmd = [sys.executable, "-m", *args]
        env = dict(os.environ)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in header]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for r in cells[1:]:
        lines.append("  ".join(c.rjust(w) if _numeric(c) else c.ljust(w)
                               for c, w in zip(r, widths, strict=True)))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _numeric(text: str) -> bool:
    return text.replace(",", "").replace(".", "").replace("x", "").replace("%", "").isdigit()
