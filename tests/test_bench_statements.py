"""The benchmarks' in-database limit (``bench.drain.drain_limit``) runs sqlmq's own
PostgreSQL acquire and settle statements in a server-side loop, their parameters bound by
hand: a statement that gains a parameter must fail here, not in the next benchmark run."""

from __future__ import annotations

import pytest

from bench.drain import drain_limit


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_the_in_database_drain_loop_archives_every_message(db_kind: str) -> None:
    assert await drain_limit(300, batch=100) > 0  # it raises unless all 300 are archived
