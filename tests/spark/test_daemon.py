"""``sqlmq.spark.daemon``, the worker daemon the tests' session runs with: a task worker
is forked with sqlmq and SQLAlchemy imported already, so a task starts without paying
for them."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.spark


def _loaded(_: object) -> tuple[bool, bool]:
    import sys

    return "sqlmq.spark" in sys.modules, "sqlalchemy" in sys.modules


def test_a_task_worker_starts_with_sqlmq_imported(spark: Any) -> None:
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == "sqlmq.spark.daemon"
    # The function is shipped by value and imports nothing itself: what it sees loaded,
    # the daemon loaded before it forked the worker.
    seen = spark.sparkContext.parallelize(range(4), 2).map(_loaded).collect()
    assert seen == [(True, True)] * 4
