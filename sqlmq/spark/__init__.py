"""sqlmq on Apache Spark: the ``sqlmq`` data source (batch and streaming reads, batch and
streaming writes) and the archive report. Needs ``pip install sqlmq[spark]`` (pyspark >= 4.2).
"""

from __future__ import annotations

from typing import Any

from .source import SqlmqDataSource


def register(spark: Any) -> None:
    """Make ``format("sqlmq")`` available in ``spark`` (once per session)."""
    spark.dataSource.register(SqlmqDataSource)


__all__ = ["SqlmqDataSource", "register"]
