"""Figures of the database-restart fault test: how long until throughput is back after a
private PostgreSQL / MariaDB restarts mid-run, for outages of a few lengths.

Runs ``tests/faults/test_restart.py`` (which also checks that nothing was lost) once per
outage length and prints the figures it recorded.

    python -m bench.faults_report --down 1 --down 5
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--down", type=float, action="append",
                        help="seconds the server stays down (repeatable; default 1 and 5)")
    parser.add_argument("--messages", type=int, default=3000)
    args = parser.parse_args()
    command = "python -m bench.faults_report " + shlex.join(sys.argv[1:])
    for down in args.down or [1.0, 5.0]:
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as figures:
            env = {**os.environ, "SQLMQ_FAULT_FIGURES": figures.name,
                   "SQLMQ_RESTART_DOWN": str(down), "SQLMQ_RESTART_MESSAGES": str(args.messages)}
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 "tests/faults/test_restart.py"], cwd=ROOT, env=env,
                capture_output=True, text=True,
            )
            for line in Path(figures.name).read_text().splitlines():
                result = json.loads(line)
                result["passed"] = done.returncode == 0
                result["command"] = command
                print(json.dumps(result), flush=True)
            if done.returncode != 0:
                print(done.stdout[-3000:], file=sys.stderr)


if __name__ == "__main__":
    main()
