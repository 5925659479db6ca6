"""A result the database refuses, while it answers everything else, must not stop the worker.

The refusal is real: a trigger on the archive table rejects one message id, as a constraint,
a trigger or a data error of the user's schema would. The worker splits its flush batch to
find that result, writes every other one, and gives the refused one up; the message stays
in the queue and comes back after its lease, so nothing is lost.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from sqlmq import Broker, Message

from .conftest import archived, on_every_engine, rows, wait_until


def _refuse_archiving(dialect: str, prefix: str, msg_id: int) -> list[str]:
    trigger = f"{prefix}refuse"
    if dialect == "postgresql":
        return [
            f"CREATE FUNCTION {trigger}() RETURNS trigger AS $$ BEGIN "
            f"IF NEW.id = {msg_id} THEN RAISE EXCEPTION 'refused by a trigger'; END IF; "
            f"RETURN NEW; END $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER {trigger} BEFORE INSERT ON {prefix}archive "
            f"FOR EACH ROW EXECUTE FUNCTION {trigger}()",
        ]
    if dialect in ("mysql", "mariadb"):
        return [
            f"CREATE TRIGGER {trigger} BEFORE INSERT ON {prefix}archive FOR EACH ROW "
            f"BEGIN IF NEW.id = {msg_id} THEN SIGNAL SQLSTATE '45000' "
            f"SET MESSAGE_TEXT = 'refused by a trigger'; END IF; END",
        ]
    return [
        f"CREATE TRIGGER {trigger} BEFORE INSERT ON {prefix}archive "
        f"WHEN NEW.id = {msg_id} BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END",
    ]


def _allow_archiving(dialect: str, prefix: str) -> list[str]:
    trigger = f"{prefix}refuse"
    if dialect == "postgresql":
        return [f"DROP TRIGGER {trigger} ON {prefix}archive", f"DROP FUNCTION {trigger}()"]
    return [f"DROP TRIGGER {trigger}"]


async def _run(broker: Broker, statements: list[str]) -> None:
    async with broker.db.begin() as conn:
        for sql in statements:
            await conn.execute(text(sql))


async def test_a_refused_result_is_given_up_and_the_rest_are_written(
    broker: Broker, prefix: str
) -> None:
    ids = await broker.publish_batch("jobs", [f"m{i}" for i in range(40)])
    bad = ids[17]
    dialect = broker.db.dialect.name
    await _run(broker, _refuse_archiving(dialect, prefix, bad))

    handled: list[tuple[int, int]] = []

    @broker.subscriber("jobs", lease=2.0, flush_batch=100, flush_interval=0.2)
    async def handle(msg: Message) -> None:
        handled.append((msg.id, msg.deliveries))

    try:
        await broker.start()
        # Every other message is archived although they share flush batches with the bad one.
        for msg_id in ids:
            if msg_id != bad:
                await archived(broker, msg_id)
        (runtime,) = broker._runtimes
        await wait_until(lambda: runtime.counters.unwritable >= 1, message="the give-up")
        # The refused message is still in the queue: nothing lost.
        assert [r["id"] for r in await rows(broker, id=bad)] == [bad]
        assert await rows(broker, "archive", id=bad) == []

        # Once the database takes it, its next delivery (after the lease) is archived.
        await _run(broker, _allow_archiving(dialect, prefix))
        row = await archived(broker, bad)
        assert row["state"] == "COMPLETED"
        assert row["deliveries_count"] >= 2
    finally:
        await broker.stop()

    assert sorted({i for i, _ in handled}) == sorted(ids)
    assert [d for i, d in handled if i != bad] == [1] * (len(ids) - 1)


@on_every_engine
async def test_a_lone_result_that_fails_by_sqlmqs_own_fault_is_given_up_with_its_traceback(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Alone in its batch, a result whose write fails with a database error is retried with
    backoff (nothing shows it is at fault rather than the database). One whose write fails
    by a fault of sqlmq's own (not a database error: retrying cannot mend it) is given up
    after the same tries, logged with its traceback, and its message comes back after its
    lease: it does not stay PROCESSING while the worker runs, holding up what follows it."""
    await broker.set_channel("c", ordered=True)
    first, second = [await broker.publish("jobs", body, channel="c") for body in ("a", "b")]
    engine = broker.engine
    faulty = {first}

    def failing(write: Any) -> Any:
        async def settle(settlements: Any, *args: Any) -> Any:
            if faulty & {s.id for s in settlements}:
                raise TypeError("'dict' object is not callable")
            return await write(settlements, *args)
        return settle

    engine.settle = failing(engine.settle)  # type: ignore[method-assign]
    engine.settle_passing = failing(engine.settle_passing)  # type: ignore[method-assign]
    handled: list[tuple[str, int]] = []

    @broker.subscriber("jobs", lease=2.0, flush_interval=0.0, max_fetch_interval=0.05)
    async def handle(msg: Message) -> None:
        handled.append((msg.body, msg.deliveries))
        if msg.deliveries > 1:
            faulty.clear()

    try:
        await broker.start()
        await archived(broker, first)
        await archived(broker, second)
    finally:
        await broker.stop()
    assert handled == [("a", 1), ("a", 2), ("b", 1)]
    (given_up,) = [r for r in caplog.records if "cannot be written" in r.getMessage()]
    assert given_up.exc_info is not None and given_up.exc_info[0] is TypeError
