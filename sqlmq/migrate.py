"""Versioned schema migrations, applied by ``sqlmq migrate`` or ``await broker.migrate()``.

Each step is idempotent and recorded in ``{prefix}schema``; concurrent migrators are
serialised by a database lock, so starting ten workers that all migrate is safe.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Connection, func, inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from .errors import SchemaError
from .schema import SCHEMA_VERSION, Schema


def _v1(conn: Connection, schema: Schema) -> None:
    schema.metadata.create_all(
        conn, tables=[schema.message, schema.archive, schema.version], checkfirst=True
    )


def _v2(conn: Connection, schema: Schema) -> None:
    schema.metadata.create_all(
        conn,
        tables=[schema.spark_consumer, schema.spark_lease, schema.spark_staging,
                schema.spark_sink_batch],
        checkfirst=True,
    )


MIGRATIONS: dict[int, Callable[[Connection, Schema], None]] = {1: _v1, 2: _v2}
assert max(MIGRATIONS) == SCHEMA_VERSION


def current_version(conn: Connection, schema: Schema) -> int:
    if not inspect(conn).has_table(schema.version.name):
        return 0
    return conn.execute(select(func.max(schema.version.c.version))).scalar() or 0


def _apply(conn: Connection, schema: Schema) -> int:
    dialect = conn.dialect.name
    if dialect == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"), {"k": schema.prefix})
    elif dialect in ("mysql", "mariadb"):
        got = conn.execute(text("SELECT GET_LOCK(:k, 60)"), {"k": f"sqlmq:{schema.prefix}"})
        if got.scalar() != 1:
            raise SchemaError("timed out waiting for another sqlmq migration to finish")
    try:
        version = current_version(conn, schema)
        for step in sorted(v for v in MIGRATIONS if v > version):
            MIGRATIONS[step](conn, schema)
            conn.execute(schema.version.insert().values(version=step, applied_at=datetime.now(UTC)))
            version = step
        return version
    finally:
        if dialect in ("mysql", "mariadb"):
            conn.execute(text("SELECT RELEASE_LOCK(:k)"), {"k": f"sqlmq:{schema.prefix}"})


async def migrate(db: AsyncEngine, schema: Schema) -> int:
    """Create or upgrade the schema; returns the version now in place."""
    async with db.begin() as conn:
        return await conn.run_sync(_apply, schema)


async def check_schema(db: AsyncEngine, schema: Schema, url: str) -> None:
    """Refuse to run on a missing or older schema, with the command that fixes it."""
    async with db.connect() as conn:
        version = await conn.run_sync(current_version, schema)
    if version == SCHEMA_VERSION:
        return
    if version == 0:
        problem = f"no sqlmq schema (tables {schema.prefix}*) in {url}"
    elif version < SCHEMA_VERSION:
        problem = f"sqlmq schema version {version} in {url}, this sqlmq needs {SCHEMA_VERSION}"
    else:
        raise SchemaError(
            f"sqlmq schema version {version} in {url} is newer than this sqlmq "
            f"({SCHEMA_VERSION}); upgrade the sqlmq package"
        )
    prefix = "" if schema.prefix == "sqlmq_" else f" --prefix {schema.prefix}"
    raise SchemaError(
        f"{problem}: run `sqlmq migrate --url {url}{prefix}` (or `await broker.migrate()`)"
    )
