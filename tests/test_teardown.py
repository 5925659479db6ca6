"""The tests' own teardown: a session left holding a lock on a test's tables makes the drop
fail within its lock wait, with an error naming the problem (and the sessions, where the
database can list them), on every database. It used to send MySQL's lock query to SQLite
(whose error then hid the real one) and to wait a day on MariaDB, whose dialect is named
``mariadb`` and so never got its lock wait set."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, select

from sqlmq import build_schema
from sqlmq.connect import parse_url, sync_url

from .conftest import drop_tables


@contextmanager
def lock_held_on_tables(url: str, prefix: str) -> Iterator[None]:
    """Another session in a transaction that holds a lock the drop needs."""
    schema = build_schema(prefix)
    if parse_url(url).get_backend_name() == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")  # the file's write lock
        try:
            yield
        finally:
            conn.rollback()
            conn.close()
        return
    engine = create_engine(sync_url(parse_url(url)))
    try:
        with engine.connect() as conn:
            conn.execute(select(schema.message.c.id))  # a read lock until the transaction ends
            try:
                yield
            finally:
                conn.rollback()
    finally:
        engine.dispose()


def test_a_drop_blocked_by_a_held_lock_fails_naming_the_problem(db_url: str, prefix: str) -> None:
    schema = build_schema(prefix)
    engine = create_engine(sync_url(parse_url(db_url)))
    try:
        schema.metadata.create_all(engine)
    finally:
        engine.dispose()
    try:
        with (lock_held_on_tables(db_url, prefix),
              pytest.raises(AssertionError, match=f"{prefix}.*waited over 1 s for locks")):
            drop_tables(db_url, prefix, lock_wait=1)
    finally:
        drop_tables(db_url, prefix)
