"""Fixtures of the fault tests: a prefix's tables, migrated for worker processes and
dropped afterwards, and a directory for the workers' execution logs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Tables


@pytest.fixture
def tables(db_url: str, prefix: str) -> Iterator[Tables]:
    t = Tables(db_url, prefix)
    t.migrate()
    try:
        yield t
    finally:
        t.drop()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "workers"
    d.mkdir()
    return d
