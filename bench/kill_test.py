"""The kill test at full size: 4 worker processes drain 100,000 messages while a driver
SIGKILLs a random one every 150-350 ms, for the whole drain (or ``--max-kills`` kills), and
starts a replacement each time.

Prints, per database: kills survived, messages lost, double archives, duplicate handler
executions and how they relate to the delivery counts. The CI version of the same run is
``tests/faults/test_kill.py`` (smaller, 50 kills).

    python -m bench.kill_test --db postgresql --db mariadb --db sqlite --messages 100000
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.faults.harness import Tables, WorkerSpec, kill_run

from .common import url_for


def run_one(db: str, messages: int, interval: tuple[float, float], sleep: float,
            max_kills: int | None) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"sqlmq-kill-{db}-"))
    url = url_for(db) if db != "sqlite" else f"sqlite:///{work}/kill.db"
    prefix = f"kill{uuid.uuid4().hex[:8]}_"
    tables = Tables(url, prefix)
    tables.migrate()
    try:
        started = time.monotonic()
        published = tables.publish("jobs", ({"n": i} for i in range(messages)), chunk=10_000)
        publish_s = time.monotonic() - started
        log_dir = work / "workers"
        log_dir.mkdir()
        spec = WorkerSpec(
            url=url, prefix=prefix, queue="jobs", log_dir=str(log_dir), sleep=sleep,
            recovery_interval=0.5,
            subscriber={"workers": 8, "fetch_batch": 16, "lease": 3.0, "flush_interval": 0.05,
                        "max_fetch_interval": 0.2},
        )
        run = kill_run(tables, spec, published, min_kills=max_kills or 50, interval=interval,
                       until_drained=max_kills is None, timeout=3600,
                       progress=lambda line: print(f"  [{db}] {line}", file=sys.stderr,
                                                   flush=True))
    finally:
        tables.drop()
    o = run.outcome
    return {
        "database": db, "messages": messages, "publish_s": round(publish_s, 1),
        "kills": run.kills, "drain_under_fire_s": round(run.seconds_under_fire, 1),
        "drain_after_last_kill_s": round(run.seconds_to_drain, 1),
        **o.as_dict(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", action="append", choices=["postgresql", "mariadb", "sqlite"])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--interval", type=float, nargs=2, default=(0.15, 0.35))
    parser.add_argument("--handler-sleep", type=float, default=0.0)
    parser.add_argument("--max-kills", type=int, default=None,
                        help="stop killing after this many kills (default: kill until drained)")
    parser.add_argument("--json", type=Path, help="append each result as a JSON line here")
    args = parser.parse_args()
    command = "python -m bench.kill_test " + shlex.join(sys.argv[1:])
    for db in args.db or ["postgresql", "mariadb", "sqlite"]:
        result = run_one(db, args.messages, tuple(args.interval), args.handler_sleep,
                         args.max_kills)
        result["command"] = command
        print(json.dumps(result), flush=True)
        if args.json:
            with args.json.open("a") as out:
                out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
