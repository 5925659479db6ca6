"""Latency of two revisions, paired: ``bench.run latency``'s cases, run alternately for each
revision round after round, so a slow minute of the machine falls on both alike.

    .venv/bin/python -m bench.paired_latency REV [--db mariadb] [--rate 2000] [--rounds 5]
        [--case both|processes|in-process]

One ``bench.run latency`` run gives each revision one 10-second window; on MariaDB and
SQLite at 2,000 msg/s its p99 swung several-fold from one run to the next, on either
revision, which hides a 5 % difference. Here each round runs one case for REV (checked out
read-only into a temporary git worktree, its own ``bench`` and ``sqlmq`` imported from it)
and for the working tree, the order flipped every round. Printed: every run's p50/p99, then
per side the median over rounds of p50, p95 and p99, and how many rounds each side won.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

CASES = {
    "processes": "latency_sqlmq",  # one subscriber process, publisher processes beside it
    "in-process": "latency_sqlmq_in_process",  # publisher and subscriber on one broker
}

RUN_ONE = """
import asyncio, json, sys
from bench import latency
fn = getattr(latency, sys.argv[1])
print(json.dumps(asyncio.run(fn(sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))))
"""


def run_one(tree: Path, case: str, db: str, rate: float, seconds: float) -> dict[str, float]:
    """One latency run of ``tree``'s sqlmq, in a fresh interpreter whose working directory
    is ``tree`` (``python -m`` puts it ahead of everything on the path)."""
    out = subprocess.run(
        [sys.executable, "-c", RUN_ONE, CASES[case], db, str(rate), str(seconds)],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, text=True,
        capture_output=True, timeout=4 * seconds + 300)
    if out.returncode != 0:
        raise SystemExit(f"a latency run of {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(rev: str, dbs: list[str], cases: list[str], rate: float, seconds: float,
            rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(old), rev],
                       check=True, capture_output=True)
        try:
            for db in dbs:
                for case in cases:
                    _pairs(rev, old, db, case, rate, seconds, rounds)
        finally:
            subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(old)],
                           check=False, capture_output=True)


def _pairs(rev: str, old: Path, db: str, case: str, rate: float, seconds: float,
           rounds: int) -> None:
    sides = [(rev, old), ("working tree", HERE)]
    runs: list[list[dict[str, float]]] = [[], []]
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            got = run_one(sides[i][1], case, db, rate, seconds)
            runs[i].append(got)
            print(f"  {db} {case} round {r + 1} {sides[i][0]:12}: p50 {got['p50']:7.2f}  "
                  f"p99 {got['p99']:7.2f} ms", flush=True)
    print(f"{db}, {case}, {rate:g} msg/s for {seconds:g} s, {rounds} paired rounds "
          f"(medians over rounds, ms)")
    for p in ("p50", "p95", "p99"):
        before = statistics.median(g[p] for g in runs[0])
        after = statistics.median(g[p] for g in runs[1])
        wins = sum(b[p] <= a[p] for a, b in zip(runs[0], runs[1], strict=True))
        print(f"  {p}: {rev} {before:8.2f}   working tree {after:8.2f}   "
              f"({(after / before - 1) * 100:+.1f} %; working tree lower or equal in "
              f"{wins} of {rounds} rounds)")
    print(flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="bench.paired_latency", description=__doc__.split("\n")[0])
    p.add_argument("rev")
    p.add_argument("--db", default="mariadb,sqlite", help="comma-separated")
    p.add_argument("--case", choices=["both", *CASES], default="both")
    p.add_argument("--rate", type=float, default=2000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    cases = list(CASES) if args.case == "both" else [args.case]
    compare(args.rev, args.db.split(","), cases, args.rate, args.seconds, args.rounds)
    print(f"reproduce: .venv/bin/python -m bench.paired_latency {args.rev} --db {args.db} "
          f"--case {args.case} --rate {args.rate:g} --seconds {args.seconds:g} "
          f"--rounds {args.rounds}")


if __name__ == "__main__":
    main()
