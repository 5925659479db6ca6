"""Batch publishes of two revisions, paired: a refactoring's "no more than 5 % worse" on a
figure that swings ±20 % from one ``bench.run publish`` to the next on this machine.

    .venv/bin/python -m bench.paired REV [--db postgresql] [--batch 5000] [--rounds 100]

One long-lived process per revision (REV checked out read-only into a temporary git
worktree, imported through PYTHONPATH by the same virtual environment; the other is this
working tree), each with a broker on tables of its own. The batches alternate between them,
one at a time, the order flipped every round, so a checkpoint or a burst of other load
falls on both alike; each side's median over its batches is compared. Also printed: the
client's CPU time per batch, which tells the client's share from the server's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sqlmq.connect import parse_url, sync_url

from .common import DATABASES, url_for

HERE = Path(__file__).resolve().parent.parent


def _start(tree: Path, db: str, prefix: str, batch: int) -> subprocess.Popen[str]:
    """A publisher importing ``tree``'s sqlmq (see ``bench/paired_child.py``). On SQLite
    each has a database file of its own: sharing one, the two took turns at its write lock
    and its checkpoints, and the one started second measured 30 % slower than on a file of
    its own."""
    url = url_for(db)
    if db == "sqlite":
        url = url.replace("/bench.db", f"/{prefix}.db")
    child = subprocess.Popen(
        [sys.executable, str(HERE / "bench" / "paired_child.py"), url,
         sync_url(parse_url(url)).render_as_string(hide_password=False), prefix, str(batch)],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        raise SystemExit(f"the publisher of {tree} did not start")
    return child


def compare(rev: str, db: str, batch: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(old), rev],
                       check=True, capture_output=True)
        try:
            sides = [(rev, _start(old, db, f"pairb{os.getpid()}_", batch)),
                     ("working tree", _start(HERE, db, f"paira{os.getpid()}_", batch))]
            walls: list[list[float]] = [[], []]
            cpus: list[list[float]] = [[], []]
            for r in range(rounds):
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                    child = sides[i][1]
                    assert child.stdin is not None and child.stdout is not None
                    child.stdin.write("go\n")
                    child.stdin.flush()
                    wall, cpu = child.stdout.readline().split()
                    walls[i].append(float(wall))
                    cpus[i].append(float(cpu))
            for _, child in sides:
                assert child.stdin is not None
                child.stdin.close()
                child.wait()
        finally:
            subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(old)],
                           check=False, capture_output=True)
    base = statistics.median(walls[0])
    print(f"publish_batch of {batch:,} on {db}, {rounds} paired rounds (medians)")
    for (name, _), w, c in zip(sides, walls, cpus, strict=True):
        med = statistics.median(w)
        print(f"  {name:14} {batch / med:9,.0f} msg/s  {(base / med - 1) * 100:+5.1f} %  "
              f"client CPU {statistics.median(c) * 1000:6.2f} ms of {med * 1000:6.2f} ms")
    print(f"reproduce: .venv/bin/python -m bench.paired {rev} --db {db} --batch {batch} "
          f"--rounds {rounds}")


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.paired", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rev", help="the revision to compare the working tree with")
    p.add_argument("--db", default="postgresql", choices=DATABASES)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=100)
    args = p.parse_args(argv)
    compare(args.rev, args.db, args.batch, args.rounds)


if __name__ == "__main__":
    main(sys.argv[1:])
