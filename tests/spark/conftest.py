"""One local SparkSession for the whole run (starting one costs seconds and ~1 GB), with the
fast settings from SPARK.md; the executors' Python is this interpreter, where sqlmq is
installed."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    # Every Python worker Spark starts imports pyspark, pyarrow and SQLAlchemy; without
    # bytecode caches each start compiles them again (seconds on a busy 2-core machine).
    # The workers inherit the JVM's environment: let them cache, outside the source tree.
    saved = {k: os.environ.pop(k, None) for k in ("PYTHONDONTWRITEBYTECODE",)}
    os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(),
                                                              "sqlmq-spark-pycache"))

    from sqlmq.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sqlmq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.sql.streaming.stopTimeout", "60s")
        # task workers forked with sqlmq imported (tests/spark/test_daemon.py): 404 -> 362 s
        # of CPU for this pass
        .config("spark.python.daemon.module", "sqlmq.spark.daemon")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    os.environ.update({k: v for k, v in saved.items() if v is not None})
    register(session)
    yield session
    session.stop()


@pytest.fixture
def opts(db_url: str, prefix: str) -> dict[str, str]:
    """The reader/writer options that point at this test's tables."""
    return {"url": db_url, "prefix": prefix}
