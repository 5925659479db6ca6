"""The Node peers, graphile-worker and pg-boss, driven from Python: their scripts in
bench/node/ (installed by ``bash bench/setup.sh`` from bench/node/package-lock.json), one
role per process, one JSON line back.

A worker role reports when its jobs are done and then waits for a line on stdin before it
shuts down, so that the caller reads the database's costs while the worker's connections
are still open (their backends' CPU is lost once they exit)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

from .common import BENCH

NODE_DIR = BENCH / "node"
SCRIPTS = {"graphile-worker": "graphile.js", "pg-boss": "pgboss.js"}


def _command(peer: str, *args: object) -> list[str]:
    node = shutil.which("node")
    if node is None:
        raise SystemExit("node is not on PATH: the Node peers need Node 20")
    if not (NODE_DIR / "node_modules").is_dir():
        raise SystemExit("the Node peers are not installed: run bash bench/setup.sh")
    return [node, SCRIPTS[peer], *map(str, args)]


def _env(dsn: str) -> dict[str, str]:
    return {**os.environ, "BENCH_PG_DSN": dsn}


def _answer(stdout: str, peer: str, role: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{peer} {role} gave no answer")
    return json.loads(lines[-1])


def node_role(peer: str, dsn: str, *args: object, timeout: float = 1800) -> dict[str, Any]:
    """Run one role of ``peer``'s script to its end; its JSON answer."""
    out = subprocess.run(_command(peer, *args), cwd=NODE_DIR, env=_env(dsn),
                         capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{peer} {args[0]} failed:\n{out.stderr[-3000:]}")
    return _answer(out.stdout, peer, str(args[0]))


@contextlib.contextmanager
def node_worker(peer: str, dsn: str, *args: object,
                timeout: float = 1800) -> Iterator[dict[str, Any]]:
    """Run a worker role of ``peer``'s script; yields its answer while it still runs, and
    lets it shut down on leaving."""
    proc = subprocess.Popen(_command(peer, "work", *args), cwd=NODE_DIR, env=_env(dsn),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()
        if not line.startswith("{"):
            proc.wait(timeout=30)
            raise RuntimeError(f"{peer} work failed (exit {proc.returncode})")
        yield json.loads(line)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
