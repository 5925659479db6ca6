"""A PySpark worker daemon with sqlmq imported before it forks (opt-in, for speed).

Spark starts Python workers by forking them from a daemon process, one daemon per kind of
worker (tasks, and each step of a Python data source: create, plan, write, commit). The
stock daemon has only PySpark imported, so every forked worker that touches the ``sqlmq``
data source imports sqlmq and SQLAlchemy itself: 1-3 s of CPU per worker on a small
machine, paid again for each worker that is not reused (a failed planning step is not).
This daemon imports them once, before forking::

    SparkSession.builder.config("spark.python.daemon.module", "sqlmq.spark.daemon")

The streaming source's runner is started as a fresh interpreter, not forked, and still
imports sqlmq itself.
"""

from __future__ import annotations

import sqlmq.spark  # noqa: F401  (imported here so that every forked worker has it)

if __name__ == "__main__":
    from pyspark.daemon import manager

    manager()
