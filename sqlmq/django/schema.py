"""sqlmq's tables in Django's migrations."""

from __future__ import annotations

from typing import Any

from .brokers import broker
from .config import config
from .portal import portal


def migrate_tables(apps: Any, schema_editor: Any) -> None:
    """Create or upgrade sqlmq's tables when migrating the database ``SQLMQ["DATABASE"]``
    names (``migrate --database`` another leaves them alone)."""
    if schema_editor.connection.alias != config().database:
        return
    b = broker()
    portal.call(b.migrate)


__all__ = ["migrate_tables"]
