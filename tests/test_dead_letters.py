"""Dead-letter events on every engine: one WARNING line per message archived FAILED or
CANCELLED, and the ``@broker.on_dead_letter`` hooks (sync and async) after the database
accepted it; a hook that raises is logged and loses nothing."""

from __future__ import annotations

import logging

import pytest

from sqlmq import Broker, ConfigurationError, DeadLetter, Retry

from .conftest import on_every_engine, wait_until


@on_every_engine
async def test_every_dead_letter_is_logged_and_reaches_the_hooks(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[DeadLetter] = []
    awaited: list[int] = []

    @broker.on_dead_letter
    def remember(dead: DeadLetter) -> None:
        seen.append(dead)

    @broker.on_dead_letter
    async def alert(dead: DeadLetter) -> None:
        awaited.append(dead.id)

    @broker.on_dead_letter
    def broken(dead: DeadLetter) -> None:
        raise RuntimeError("the pager is down")

    @broker.subscriber("jobs", retry=Retry.constant(0, max_attempts=2), lease=30)
    async def handle(body: dict) -> None:
        if body["n"] % 2:
            raise ValueError(f"odd {body['n']}")

    ids = [await broker.publish("jobs", {"n": n}, headers={"k": str(n)}) for n in range(4)]
    waiting = await broker.publish("later", {"n": 9}, delay=3600)
    caplog.set_level(logging.WARNING, logger="sqlmq")
    await broker.start()
    try:
        await wait_until(lambda: len(awaited) == 2, timeout=60)
        assert (await broker.cancel(waiting)).outcome == "cancelled"
        await wait_until(lambda: len(awaited) == 3, timeout=60)
    finally:
        await broker.stop()
    failed = sorted(d.id for d in seen if d.state == "FAILED")
    assert failed == [ids[1], ids[3]] and sorted(awaited[:2]) == failed
    one = next(d for d in seen if d.id == ids[1])
    assert (one.queue, one.deliveries, one.headers["k"]) == ("jobs", 2, "1")
    assert one.error is not None and "ValueError: odd 1" in one.error
    (cancelled,) = [d for d in seen if d.state == "CANCELLED"]
    assert (cancelled.id, cancelled.queue) == (waiting, "later")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dead letter")]
    assert len(lines) == 3
    assert (f"dead letter: queue=jobs id={ids[1]} state=FAILED deliveries=2 "
            "reason=ValueError: odd 1") in lines
    assert sum("the pager is down" in (r.exc_text or str(r.exc_info)) or
               "on_dead_letter hook" in r.getMessage() for r in caplog.records) >= 3
    stats = {s.queue: s for s in await broker.stats()}
    assert (stats["jobs"].failed, stats["jobs"].completed, stats["later"].cancelled) == (2, 2, 1)


@on_every_engine
@pytest.mark.parametrize("mode", ["failed", "none"])
async def test_a_subscriber_that_does_not_archive_everything_deletes_the_rest(
    broker: Broker, mode: str
) -> None:
    """``archive="failed"`` keeps the dead letters only; ``"none"`` keeps nothing, and its
    dead letters still reach the hooks before they are gone."""
    seen: list[int] = []
    broker.on_dead_letter(lambda dead: seen.append(dead.id))
    handled: list[int] = []

    @broker.subscriber("jobs", retry=Retry.none(), archive=mode, max_fetch_interval=0.05)
    async def handle(body: dict) -> None:
        handled.append(body["n"])
        if body["n"] % 2:
            raise ValueError(f"odd {body['n']}")

    ids = await broker.publish_batch("jobs", [{"n": n} for n in range(6)])
    await broker.start()
    try:
        await wait_until(lambda: len(seen) == 3, timeout=60)
        await wait_until(lambda: _no_live(broker), timeout=60)
    finally:
        await broker.stop()
    assert sorted(seen) == ids[1::2] and sorted(handled) == list(range(6))
    views = [await broker.insights().message(i) for i in ids]
    kept = {v.id: v.state for v in views if v is not None}
    assert kept == ({i: "FAILED" for i in ids[1::2]} if mode == "failed" else {})


async def _no_live(broker: Broker) -> bool:
    return not any(s.pending or s.processing or s.retryable for s in await broker.stats())


async def test_archive_takes_all_failed_or_none(broker: Broker) -> None:
    with pytest.raises(ConfigurationError, match="archive must be 'all', 'failed' or 'none'"):
        broker.subscriber("jobs", archive="some")
