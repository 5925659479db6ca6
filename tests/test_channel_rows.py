"""A channel's row made and forgotten again between a statement that makes it and the one
that reads or updates it (the leader's forgetting of idle channels, every time): after a
few tries, ``set_channel`` and a publish fail with an error that names the channel, and
nothing is written. Not reachable by one sweeper a minute; made here by an insert that
makes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import literal, select

from sqlmq import Broker
from sqlmq.engines.sql import room as core_room

from .conftest import rows


@pytest.fixture
def rows_never_made(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def nothing(table: Any, values: dict[str, Any]) -> Any:
        return select(literal(1))

    monkeypatch.setattr(core_room, "_INSERT_IGNORE",
                        dict.fromkeys(core_room._INSERT_IGNORE, nothing))
    core_room.room_statements.cache_clear()  # built once per schema: again, with the above
    yield
    monkeypatch.undo()
    core_room.room_statements.cache_clear()


async def test_set_channel_says_its_row_vanished(broker: Broker,
                                                 rows_never_made: None) -> None:
    with pytest.raises(RuntimeError, match="channel 'c': its row vanished 3 times"):
        await broker.set_channel("c", max_concurrency=2)
    assert await broker.channels() == []


async def test_a_publish_says_its_channels_row_vanished_and_writes_nothing(
        broker: Broker, rows_never_made: None) -> None:
    with pytest.raises(RuntimeError, match="channel 'c': its row vanished 3 times"):
        await broker.publish("q", b"x", channel="c")
    assert await rows(broker) == []
