"""Deduplication keys through the broker: publishers in several processes with the same
keys leave one message per key; a subscriber handles a keyed message once however often it
was published while waiting; bad keys are refused before anything is written. The engine
rules, on every engine, are ``tests/contract/test_dedup.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import func, select

from sqlmq import Broker, Message, Published, PublishError
from sqlmq.schema import MAX_DEDUP_KEY

from .conftest import drained, on_every_engine, wait_until
from .procs import ROOT

PUBLISHERS = 4
KEYS = 400


async def test_four_processes_publishing_the_same_keys_leave_one_message_per_key(
    broker: Broker, db_url: str, prefix: str, tmp_path: Path,
) -> None:
    outs = [tmp_path / f"publisher{i}.jsonl" for i in range(PUBLISHERS)]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.dedup_publisher", db_url, prefix, str(seed),
         str(KEYS), str(out)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for seed, out in enumerate(outs)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", \
                p.stderr.read() if p.stderr else ""
        for p in procs:  # all at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [p.stderr.read() if p.stderr else "" for p in procs]
    print("deadlocks run again:", sum(log.count("deadlock") for log in logs))
    assert codes == [0] * PUBLISHERS, "\n".join(log[-3000:] for log in logs)

    m = broker.schema.message
    async with broker.db.connect() as conn:
        stored = dict((await conn.execute(
            select(m.c.dedup_key, m.c.id).where(m.c.queue == "dedup"))).all())
        total = (await conn.execute(select(func.count()).select_from(m))).scalar_one()
    assert len(stored) == total == KEYS

    answers: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    for out in outs:
        for line in out.read_text().splitlines():
            key, msg_id, duplicate = json.loads(line)
            answers[key].append((msg_id, duplicate))
    assert sorted(answers) == sorted(stored)
    for key, got in answers.items():
        assert len(got) == PUBLISHERS
        assert {msg_id for msg_id, _ in got} == {stored[key]}, key  # everyone got its id
        assert [d for _, d in got].count(False) == 1, key  # exactly one wrote it


@on_every_engine
async def test_a_subscriber_handles_a_keyed_message_once_however_often_published(
    broker: Broker,
) -> None:
    handled: list[tuple[int, str]] = []

    @broker.subscriber("jobs", max_fetch_interval=0.05)
    async def job(msg: Message) -> None:
        handled.append((msg.id, msg.body))

    first = await broker.publish("jobs", "first", dedup_key="nightly", delay=0.5)
    for _ in range(5):  # while it waits
        again = await broker.publish("jobs", "again", dedup_key="nightly")
        assert (again, again.duplicate) == (first, True)  # type: ignore[attr-defined]
    await broker.start()
    await wait_until(lambda: drained(broker, "jobs"), timeout=30)
    later = await broker.publish("jobs", "later", dedup_key="nightly")
    assert later.duplicate is False  # type: ignore[attr-defined]
    await wait_until(lambda: len(handled) == 2, timeout=30)
    await broker.stop()
    assert handled == [(first, "first"), (later, "later")]


@pytest.mark.parametrize("keys, problem", [
    ([7], "must be a string, got int"),
    ([b"k"], "must be a string, got bytes"),
    ([""], "1 to 255 characters, got 0"),
    (["x" * (MAX_DEDUP_KEY + 1)], "1 to 255 characters, got 256"),
    (["a\x00b"], "NUL"),
    (["\ud800"], "lone surrogate"),
    (["a", "b"], "2 keys for 1 messages"),
    ("a", "a sequence with a key"),
])
@on_every_engine
async def test_bad_keys_are_refused_before_anything_is_written(
    broker: Broker, keys: object, problem: str,
) -> None:
    with pytest.raises(PublishError, match=problem):
        await broker.publish_batch("q", ["body"], dedup_keys=keys)  # type: ignore[arg-type]
    with pytest.raises(PublishError, match=problem):
        broker.publish_batch_sync("q", ["body"], dedup_keys=keys)  # type: ignore[arg-type]
    assert [s for s in await broker.stats() if s.queue == "q"] == []


def test_published_is_the_id_and_says_whether_it_was_a_duplicate() -> None:
    import pickle

    p = Published(42, True)
    assert p == 42 and int(p) == 42 and hash(p) == hash(42) and p.duplicate
    assert repr(p) == "Published(42, duplicate=True)"
    back = pickle.loads(pickle.dumps(p))
    assert (back, back.duplicate) == (42, True)
