"""Every message of a queue reaches each real far broker with its sqlmq id and publish time,
and an ordered channel's messages reach it in publish order.

5,000 messages on PostgreSQL, 2,000 on MariaDB and SQLite: the same paths with fewer
rows, so the four brokers on three databases stay within a couple of minutes on two
cores (the throughput itself is bench/relay.py's business)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from sqlmq import Broker, Relay

from ..conftest import drained, drop_tables, rows, wait_until
from .far import KINDS, Arrived, far_for

COUNTS = {"postgresql": 5_000, "mariadb": 2_000, "sqlite": 2_000}
#: Ordered channels among the messages, and how many messages each has.
CHANNELS, PER_CHANNEL = 5, 40


async def publish_mix(broker: Broker, queue: str, count: int) -> dict[str | None, list[int]]:
    """``count`` messages: ``CHANNELS`` ordered channels of ``PER_CHANNEL``, their publishes
    between those of the rest (no channel). The ids by channel (None: no channel)."""
    ids: dict[str | None, list[int]] = {None: []}
    plain = count - CHANNELS * PER_CHANNEL
    chunk = plain // PER_CHANNEL
    for c in range(CHANNELS):
        await broker.set_channel(f"ordered-{c}", ordered=True)
        ids[f"ordered-{c}"] = []
    for k in range(PER_CHANNEL):
        first = k * chunk
        last = plain if k == PER_CHANNEL - 1 else first + chunk
        ids[None] += await broker.publish_batch(queue, [{"n": i} for i in range(first, last)])
        for c in range(CHANNELS):
            ids[f"ordered-{c}"] += await broker.publish_batch(
                queue, [{"channel": c, "k": k}], channel=f"ordered-{c}")
    return ids


def check_arrivals(arrived: list[Arrived], ids: dict[str | None, list[int]],
                   archived: dict[int, datetime]) -> None:
    every = sorted(i for group in ids.values() for i in group)
    seen = [a.id for a in arrived]
    assert len(seen) == len(set(seen)), "a message arrived twice in a run without faults"
    assert sorted(seen) == every, (f"{len(set(every) - set(seen))} missing, "
                                   f"{len(set(seen) - set(every))} unknown")
    position = {a.id: n for n, a in enumerate(arrived)}
    for channel, members in ids.items():
        if channel is not None:
            assert sorted(members, key=position.__getitem__) == members, channel
    for a in arrived:
        assert datetime.fromisoformat(a.published_at) == archived[a.id], a.id
        assert a.native_id in (None, str(a.id))


@pytest.mark.parametrize("kind", KINDS)
async def test_every_message_arrives_once_with_its_id_and_ordered_channels_in_order(
        kind: str, db_kind: str, db_url: str, prefix: str, tmp_path: Path) -> None:
    far = far_for(kind, f"relay-{prefix.rstrip('_')}", tmp_path)
    await far.prepare()
    broker = Broker(db_url, table_prefix=prefix)
    try:
        await broker.migrate()
        relay = Relay(broker, "outbox", to=far.url, **far.options)
        ids = await publish_mix(broker, "outbox", COUNTS[db_kind])
        await broker.start()
        total = COUNTS[db_kind]
        arrived = await far.collect(total, timeout=120)
        await wait_until(lambda: drained(broker, "outbox"), timeout=60,
                         message="every relayed message archived")
        archived = {r["id"]: _utc(r["created_at"])
                    for r in await rows(broker, "archive", queue="outbox", state="COMPLETED")}
        assert len(archived) == total
        check_arrivals(arrived, ids, archived)
        assert (relay.stats.sent, relay.stats.refused) == (total, 0)
    finally:
        await broker.close()
        await far.remove()
        drop_tables(db_url, prefix)


def _utc(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
