"""A PySpark worker daemon with sqlmq imported before it forks (opt-in, for speed).

Spark starts its task workers by forking them from a daemon process. The stock daemon has
only PySpark imported, so each forked worker that reads or writes the ``sqlmq`` format
imports sqlmq and SQLAlchemy itself: 1-3 s of CPU per worker on a small machine. This
daemon imports them once, before it forks::

    SparkSession.builder.config("spark.python.daemon.module", "sqlmq.spark.daemon")

Spark forks the data source's planning steps (create, plan, write, commit) from its own
daemon whatever this setting says, and starts the streaming source's runner as a new
interpreter: those still import sqlmq themselves (the package root imports its names on
first use, which keeps that import to what the Spark side needs).
"""

from __future__ import annotations

import sqlmq.spark  # noqa: F401  (imported here so that every forked worker has it)

if __name__ == "__main__":
    from pyspark.daemon import manager

    manager()
