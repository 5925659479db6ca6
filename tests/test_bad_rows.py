"""A message row that sqlmq cannot decode after acquiring it (hand edits, other writers, a
bad migration) is archived FAILED with the reason, alone: the rest of its batch runs
normally, once, and every worker stays alive. The rows are spoilt with real SQL."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import text

from sqlmq import Broker, Message

from .conftest import drained, wait_until

# (name, column, SQL expression per dialect, what the archived error says)
SPOILS: list[tuple[str, str, dict[str, str], str]] = [
    ("headers array", "headers",
     {"postgresql": "CAST('[1, 2]' AS JSONB)", "sqlite": "'[1, 2]'", "mysql": "'[1, 2]'"},
     "headers are a JSON array, not an object"),
    ("header number", "headers",
     {"postgresql": "CAST('{\"n\": 1}' AS JSONB)", "sqlite": "'{\"n\": 1}'",
      "mysql": "'{\"n\": 1}'"},
     "header 'n' is a JSON number, not a string"),
    ("history object", "history",
     {"postgresql": "CAST('{\"a\": 1}' AS JSONB)", "sqlite": "'{\"a\": 1}'",
      "mysql": "'{\"a\": 1}'"},
     "history is a JSON object, not an array"),
    ("invalid json headers", "headers", {"sqlite": "'{not json'"},
     "headers are not valid JSON"),
    ("payload text", "payload", {"sqlite": "'plain text'"},
     "payload is stored as TEXT, not as a BLOB"),
    ("timestamp text", "created_at", {"sqlite": "'garbage'"}, "malformed timestamp 'garbage'"),
    ("timestamp infinity", "created_at", {"postgresql": "'infinity'"}, "malformed timestamp"),
]


async def test_a_bad_row_fails_alone_and_its_batch_runs_once(
    broker: Broker, caplog: pytest.LogCaptureFixture,
) -> None:
    dialect = "mysql" if broker.db.dialect.name == "mariadb" else broker.db.dialect.name
    spoils = [s for s in SPOILS if dialect in s[2]]
    handled: list[int] = []

    @broker.subscriber("q", workers=2, fetch_batch=50, flush_interval=0.01,
                       max_fetch_interval=0.05, lease=30)
    async def handle(msg: Message) -> None:
        handled.append(msg.body)

    ids = await broker.publish_batch("q", range(2 * len(spoils) + 1))
    bad = {ids[2 * i + 1]: spoil for i, spoil in enumerate(spoils)}
    m = broker.schema.message.name
    async with broker.db.begin() as conn:
        for msg_id, (_, col, sql, _) in bad.items():
            await conn.execute(text(f"UPDATE {m} SET {col} = {sql[dialect]} WHERE id = {msg_id}"))

    caplog.set_level(logging.ERROR, logger="sqlmq")
    await broker.start()
    try:
        await wait_until(lambda: drained(broker, "q"), message="every row archived")
        (runtime,) = broker.runtimes
        assert all(not w.done() for w in runtime.workers.tasks), "a worker task died"
    finally:
        await broker.stop()

    async with broker.db.connect() as conn:  # not through the JSON types: rows are spoilt
        archived = {r.id: r._mapping for r in await conn.execute(text(
            "SELECT id, state, error, attempts_count, deliveries_count FROM "
            f"{broker.schema.archive.name}"))}
    assert set(archived) == set(ids)
    for msg_id in ids:
        row = archived[msg_id]
        if msg_id in bad:
            name, _, _, reason = bad[msg_id]
            assert row["state"] == "FAILED", name
            assert row["error"].startswith("undecodable row: "), name
            assert reason in row["error"], name
            assert (row["attempts_count"], row["deliveries_count"]) == (0, 1), name
            assert any(str(msg_id) in r.getMessage() and reason in r.getMessage()
                       for r in caplog.records), name
        else:
            assert (row["state"], row["deliveries_count"]) == ("COMPLETED", 1)
    assert sorted(handled) == sorted(i for i, msg_id in enumerate(ids) if msg_id not in bad)
