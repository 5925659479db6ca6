"""``sqlmq.commit_hooks.on_commit``: the one hook both the outbox wake-ups and the memory
engine's outbox use. A callback runs once, at the outermost commit, never at a savepoint's
release, and is forgotten when the outermost transaction rolls back or ends without one."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from sqlmq.commit_hooks import on_commit


def _engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    engine = create_engine(f"sqlite:///{tmp_path / 'hooks.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    return engine


def test_a_session_runs_callbacks_at_the_outermost_commit_not_at_a_savepoint(
    tmp_path: Path,
) -> None:
    fired: list[str] = []
    with Session(_engine(tmp_path)) as session:
        session.execute(text("INSERT INTO t VALUES (1)"))
        with session.begin_nested():
            on_commit(session, "k", lambda: fired.append("k"))
            on_commit(session, "k", lambda: fired.append("again"))  # same key: no-op
            on_commit(session, "other", lambda: fired.append("other"))
        assert fired == []  # the savepoint was released: not a commit of the transaction
        session.commit()
        assert fired == ["k", "other"]
        session.execute(text("INSERT INTO t VALUES (2)"))
        session.commit()
        assert fired == ["k", "other"]  # once


def test_a_session_forgets_callbacks_when_it_rolls_back_or_closes(tmp_path: Path) -> None:
    fired: list[str] = []
    engine = _engine(tmp_path)
    with Session(engine) as session:
        session.execute(text("INSERT INTO t VALUES (1)"))
        on_commit(session, "k", lambda: fired.append("rolled back"))
        session.rollback()
        session.execute(text("INSERT INTO t VALUES (2)"))
        session.commit()
        session.execute(text("INSERT INTO t VALUES (3)"))
        on_commit(session, "k", lambda: fired.append("closed"))
    with Session(engine) as session:
        session.execute(text("INSERT INTO t VALUES (4)"))
        session.commit()
    assert fired == []


def test_a_connection_runs_callbacks_at_commit_and_forgets_them_at_rollback(
    tmp_path: Path,
) -> None:
    fired: list[str] = []
    engine = _engine(tmp_path)
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO t VALUES (1)"))
        on_commit(conn, "k", lambda: fired.append("rolled back"))
        conn.rollback()
        conn.execute(text("INSERT INTO t VALUES (2)"))
        on_commit(conn, "k", lambda: fired.append("committed"))
        conn.commit()
        conn.execute(text("INSERT INTO t VALUES (3)"))
        conn.commit()
    assert fired == ["committed"]
