"""The Spark source's and sink's bookkeeping, one *Spark ledger* per database.

:func:`ledger_for` is the one place that picks it, from the dialect of a synchronous
SQLAlchemy engine; ``sqlmq.spark`` calls its methods and never asks which database it is on.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import Engine as SyncEngine

from ...errors import ConfigurationError
from ...schema import Schema
from .ledger import ACQUIRE_CHUNK, LEASED_COLUMNS, Lease, SparkLedger


def ledger_for(sql_engine: SyncEngine, schema: Schema,
               checkpoint: Callable[[str], None] | None = None) -> SparkLedger:
    """The ledger of ``sql_engine``'s database for the tables of ``schema``; ``checkpoint``
    is called at named points between statements (crash tests)."""
    name = sql_engine.dialect.name
    if name == "postgresql":
        from ..postgresql.spark_ledger import PostgresLedger

        return PostgresLedger(sql_engine, schema, checkpoint)
    if name in ("mysql", "mariadb"):
        from ..mysql.spark_ledger import MysqlLedger

        return MysqlLedger(sql_engine, schema, checkpoint)
    if name == "sqlite":
        from ..sqlite.spark_ledger import SqliteLedger

        return SqliteLedger(sql_engine, schema, checkpoint)
    raise ConfigurationError(f"no sqlmq Spark ledger for database {name!r}")


__all__ = ["ACQUIRE_CHUNK", "LEASED_COLUMNS", "Lease", "SparkLedger", "ledger_for"]
