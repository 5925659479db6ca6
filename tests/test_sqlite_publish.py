"""SQLite: a single publish on sqlmq's own engine takes a short path straight on aiosqlite
(``SqliteEngine.insert_one``); its row must be the one the general INSERT writes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sqlmq import Broker

from .conftest import rows

SAME = ("queue", "headers", "payload", "state", "attempts_count", "deliveries_count",
        "acquired_at", "first_attempt_at", "last_attempt_at", "lease_expires_at", "last_error",
        "history")


@pytest.mark.parametrize("db_kind", ["sqlite"])
@pytest.mark.parametrize("delay", [None, 90.5])
async def test_single_publish_writes_the_row_a_batch_publish_writes(
    broker: Broker, delay: float | None
) -> None:
    body = {"n": 1, "text": "é\x00"}
    headers = {"k": "v", "é": "ü"}
    one = await broker.publish("jobs", body, headers=headers, delay=delay)
    general = (await broker.publish_batch("jobs", [body, body], headers=headers,
                                          delay=delay))[0]
    (a,), (b,) = [await rows(broker, id=i) for i in (one, general)]
    assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
    for row in (a, b):
        wait = row["next_attempt_at"] - row["created_at"]
        assert abs(wait - timedelta(seconds=delay or 0)) < timedelta(milliseconds=1)
    assert abs(a["created_at"] - b["created_at"]) < timedelta(seconds=5)


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_single_publish_to_a_missing_table_fails_clearly(broker: Broker) -> None:
    other = Broker(broker.db.url.render_as_string(hide_password=False),
                   table_prefix="nosuch_")
    try:
        with pytest.raises(Exception, match="no such table: nosuch_message"):
            await other.publish("jobs", "x")
    finally:
        await other.close()
