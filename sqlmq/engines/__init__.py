"""One engine per database behind the :class:`Engine` contract."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import ConfigurationError
from ..schema import Schema
from .base import Engine


def engine_for(db: AsyncEngine, schema: Schema) -> Engine:
    name = db.dialect.name
    if name == "postgresql":
        from .postgres import PostgresEngine

        return PostgresEngine(db, schema)
    if name in ("mysql", "mariadb"):
        from .mysql import MysqlEngine

        return MysqlEngine(db, schema)
    if name == "sqlite":
        from .sqlite import SqliteEngine

        return SqliteEngine(db, schema)
    raise ConfigurationError(f"no sqlmq engine for database {name!r}")


__all__ = ["Engine", "engine_for"]
