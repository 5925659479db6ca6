"""The SQL engines' lookouts (``sqlmq.engines.sql.fair.Lookout``): whether a channel, a limit
or a channel without limits exists, which an engine that has seen none looks for again every
``CHANNEL_LOOK_INTERVAL``, as another process may have made one. On PostgreSQL, MariaDB and
SQLite (the in-memory engine has no such part: it sees its rows)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from sqlmq import Broker
from sqlmq.engines.sql import fair as core_fair

from .conftest import sibling


async def test_channels_another_broker_makes_are_looked_for_beside_the_acquire(
        broker: Broker, db_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """An engine that has seen no channel looks again every CHANNEL_LOOK_INTERVAL whether
    another process made one. Only the first look is the acquire's: the later ones run
    beside it, so the acquire that starts one goes on without channels, and the next after
    the look serves them. A failed look is one warning line and the look runs again."""
    monkeypatch.setattr(core_fair, "CHANNEL_LOOK_INTERVAL", 0.05)
    caplog.set_level(logging.WARNING, logger="sqlmq")
    other = sibling(broker, db_url, prefix)
    engine = broker.engine
    lookout = engine._lookouts.channels  # type: ignore[attr-defined]
    look = lookout.look

    async def broken(conn: Any) -> Any:
        raise OperationalError("SELECT name FROM channel", None,
                               Exception("server closed the connection"))

    async def looked() -> None:
        await asyncio.sleep(0.06)  # past the interval: this acquire starts a look
        before = lookout.looked_at
        assert await engine.acquire(["q"], 10, 30) == []
        if lookout.task is not None:  # it may have ended while the acquire ran
            await lookout.task
        assert lookout.task is None and lookout.looked_at > before

    try:
        plain = await broker.publish("q", b"p")
        assert [d.id for d in await engine.acquire(["q"], 10, 30)] == [plain]  # no channel
        sent = await other.publish("q", b"c", channel="x")
        lookout.look = broken
        await looked()
        assert not lookout.seen
        lookout.look = look
        await looked()
        assert lookout.seen
        assert [d.id for d in await engine.acquire(["q"], 10, 30)] == [sent]
        lines = [r.getMessage() for r in caplog.records]
        assert lines == ["looking for a channel failed (Exception: server closed the "
                         "connection); looking again every 0.1 s",
                         "looking for a channel recovered after 1 failed looks"]
        assert all(r.exc_info is None for r in caplog.records)
    finally:
        await other.close()
