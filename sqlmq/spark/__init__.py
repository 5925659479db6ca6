"""sqlmq on Apache Spark: the ``sqlmq`` data source (batch and streaming reads, batch and
streaming writes) and the archive report. Needs ``pip install sqlmq[spark]`` (pyspark >= 4.2).
"""

from __future__ import annotations

from typing import Any

from .source import SqlmqDataSource

#: Spark refuses a batch read from a Python source that can take filters unless this is on
#: (``DATA_SOURCE_PUSHDOWN_DISABLED``); sqlmq's batch reader takes them.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any) -> None:
    """Make ``format("sqlmq")`` available in ``spark`` (once per session), with the filter
    pushdown its batch reader needs."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(SqlmqDataSource)


__all__ = ["SqlmqDataSource", "register"]
