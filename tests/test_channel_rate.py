"""A channel's rate spaces its starts as stamped on the deliveries (``acquired_at``), on each
database, however long the take comes after the read that let it start."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from sqlmq import Broker, ChannelSettings

from .conftest import wait_until


async def test_a_rate_counts_from_the_start_stamped_however_late_the_take(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    engine: Any = broker.engine
    await engine.set_channel("slow", "q", ChannelSettings(rate=4))
    for n in range(2):
        await broker.publish("q", {"n": n}, channel="slow")
    serve = engine._serve

    async def late(*args: Any, **kwargs: Any) -> Any:
        """The first take: 0.2 s after the read (a loaded machine, a slow database)."""
        monkeypatch.setattr(engine, "_serve", serve)
        await asyncio.sleep(0.2)
        return await serve(*args, **kwargs)

    monkeypatch.setattr(engine, "_serve", late)
    (first,) = await engine.acquire(["q"], 10, 30)
    came: list[Any] = []

    async def second() -> bool:
        came.extend(await engine.acquire(["q"], 10, 30))
        return bool(came)

    await wait_until(second, timeout=10, message="the second start")
    # Counted from the read, the next start was due 0.05 s after this one's acquired_at.
    assert came[0].acquired_at - first.acquired_at >= timedelta(seconds=0.25), (
        first.acquired_at, came[0].acquired_at)
