"""The fault harness itself: a worker process that cannot start fails the test at once,
with its own error, instead of leaving it to wait out its timeout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .harness import WorkerPool, WorkerSpec, wait_ready


@pytest.mark.parametrize("db_kind", ["sqlite"])
def test_a_worker_that_cannot_start_fails_the_wait_with_its_error(
    db_url: str, prefix: str, log_dir: Path
) -> None:
    spec = WorkerSpec(url=db_url, prefix=prefix, queue="jobs", log_dir=str(log_dir))
    pool = WorkerPool(spec)  # the prefix's tables were never made: the broker cannot start
    began = time.monotonic()
    try:
        pool.start()
        with pytest.raises(AssertionError) as failed:
            wait_ready(log_dir, 1, timeout=60, watch=[pool])
    finally:
        pool.stop()
    assert time.monotonic() - began < 30
    assert "exited with 1 unasked" in str(failed.value)
    assert "sqlmq migrate" in str(failed.value)  # the worker's own error, from its stderr
