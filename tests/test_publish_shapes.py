"""The Core publish's statements are built once per shape (``core_publish._insert``: a
channel's or not, due after a delay or at a moment, expiring after seconds or at a moment
or never) with the publish's values as parameters: each shape writes what it was given,
in the caller's transaction and in sqlmq's own, with and without a deduplication key.
And MySQL 8's path (no RETURNING: one multi-row INSERT whose ids are consecutive), run on
MariaDB with its RETURNING switched off."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sqlmq import Broker

from .conftest import rows

AT = datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
EXPIRES_AT = datetime(2032, 1, 2, 3, 4, 5, 456000, tzinfo=UTC)
#: Rounding of stored times (SQLite keeps milliseconds) and the clocks' granularity.
SLACK = timedelta(seconds=1)


class Between:
    """The database's clock before the publishes and after them: a time a publish computed
    from its own now lies in that window (shifted), however long the publishes took (one
    run on a loaded machine took 7 s for the eight)."""

    def __init__(self, before: datetime, after: datetime) -> None:
        self.before, self.after = before, after

    def holds(self, value: datetime | None, offset: timedelta) -> bool:
        return value is not None and (self.before + offset - SLACK
                                      <= value.astimezone(UTC)
                                      <= self.after + offset + SLACK)


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb", "sqlite"])
@pytest.mark.parametrize("in_callers", [True, False], ids=["caller's", "own"])
async def test_every_shape_writes_what_it_was_given(broker: Broker, in_callers: bool) -> None:
    shapes: dict[str, dict[str, Any]] = {
        "delay": {"delay": 60},
        "at": {"at": AT},
        "expires in": {"expires": 30},
        "expires at": {"expires": EXPIRES_AT},
        "channel, delay": {"channel": "c", "delay": 60, "expires": 30},
        "channel, at": {"channel": "c", "at": AT, "expires": EXPIRES_AT},
        "keyed": {"dedup_key": "k", "delay": 60, "expires": 30},
        "keyed channel": {"dedup_key": "k2", "channel": "c", "at": AT},
    }
    ids: dict[str, int] = {}
    before = await broker.engine.now()
    if in_callers:
        async with broker.db.begin() as conn:
            for name, options in shapes.items():
                ids[name] = await broker.publish("q", name, connection=conn, **options)
    else:
        for name, options in shapes.items():
            ids[name] = await broker.publish("q", name, **options)
    then = Between(before, await broker.engine.now())
    by_id = {r["id"]: r for r in await rows(broker)}
    got = {name: by_id[i] for name, i in ids.items()}
    assert {name: r["payload"].decode() for name, r in got.items()} == {n: n for n in shapes}
    later, expiry = timedelta(seconds=60), timedelta(seconds=30)
    assert then.holds(got["delay"]["next_attempt_at"], later)
    assert got["at"]["next_attempt_at"].astimezone(UTC) == AT
    assert then.holds(got["expires in"]["expires_at"], expiry)
    assert got["expires at"]["expires_at"].astimezone(UTC) == EXPIRES_AT
    assert got["delay"]["expires_at"] is None
    for name in ("channel, delay", "channel, at", "keyed channel"):
        r = got[name]
        assert (r["channel"], r["next_attempt_at"]) == ("c", None) and r["fair_key"] is not None
    assert then.holds(got["channel, delay"]["channel_due_at"], later)
    assert then.holds(got["channel, delay"]["expires_at"], expiry)
    assert got["channel, at"]["channel_due_at"].astimezone(UTC) == AT
    assert got["channel, at"]["expires_at"].astimezone(UTC) == EXPIRES_AT
    assert then.holds(got["keyed"]["next_attempt_at"], later)
    assert then.holds(got["keyed"]["expires_at"], expiry)
    assert got["keyed channel"]["channel_due_at"].astimezone(UTC) == AT
    assert all(r["state"] == "PENDING" and r["priority"] == 0 for r in got.values())


@pytest.mark.parametrize("db_kind", ["mariadb"])
async def test_mysql_8s_insert_without_returning(broker: Broker,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    before = await broker.engine.now()
    async with broker.db.begin() as conn:
        monkeypatch.setattr(conn.dialect, "insert_returning", False)
        ids = await broker.publish_batch("q", ["a", "b", "c"], delay=60, priority=3,
                                         connection=conn)
        in_channel = await broker.publish("q", "d", channel="c", connection=conn)
    monkeypatch.undo()
    then = Between(before, await broker.engine.now())
    by_id = {r["id"]: r for r in await rows(broker)}
    assert [by_id[i]["payload"] for i in ids] == [b"a", b"b", b"c"]
    assert ids == list(range(ids[0], ids[0] + 3))
    assert all(by_id[i]["priority"] == 3
               and then.holds(by_id[i]["next_attempt_at"], timedelta(seconds=60)) for i in ids)
    assert by_id[in_channel]["channel"] == "c" and by_id[in_channel]["payload"] == b"d"
