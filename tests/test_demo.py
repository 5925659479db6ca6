"""``sqlmq demo`` as a newcomer runs it: a progress bar, a line per dead letter and the
summary on the terminal; the handlers' tracebacks in the log file the summary names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .conftest import drop_tables


def test_the_demo_keeps_tracebacks_off_the_terminal(db_url: str, prefix: str,
                                                    tmp_path: Path) -> None:
    command = [sys.executable, "-m", "sqlmq.cli", "demo", "--url", db_url, "--prefix", prefix,
               "--messages", "200", "--processes", "1"]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=600,
                             cwd=tmp_path)
    finally:
        drop_tables(db_url, prefix)
    shown = run.stdout + run.stderr
    named = re.search(r"what else the processes logged: (\S+)", shown)
    log = None if named is None else Path(named.group(1))
    try:
        assert run.returncode == 0, shown
        assert "Traceback" not in shown
        assert "sqlmq demo: what the database says" in shown
        assert log is not None, shown
        logged = log.read_text()
    finally:
        if log is not None and not log.is_relative_to(tmp_path):
            log.unlink(missing_ok=True)
    assert "Traceback (most recent call last)" in logged
    assert "RuntimeError: payment gateway timeout" in logged
    (failed,) = re.findall(r"archived FAILED \(dead letters\)\s*│\s*(\d+)", shown)
    dead = [line for line in shown.splitlines() if line.startswith("dead letter ")]
    assert len(dead) == int(failed) > 0
    assert any("max deliveries exceeded" in line for line in dead)  # the poison message
