"""The operator's commands on every database with real rows: inspect, show, publish from a
file and from stdin, dlq show/requeue/purge in batches, purge --older-than, dlq watch, and
their errors (unknown queue or id, bad duration, bad JSON line)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
import threading
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import insert

from sqlmq import Broker, Message, Outcome, Settlement

from .conftest import PG_URL, CliResult, rows, run_cli, wait_until


async def cli(*args: str) -> CliResult:
    return await asyncio.to_thread(run_cli, *args)


@pytest.fixture
def where(db_url: str, prefix: str) -> list[str]:
    return ["--url", db_url, "--prefix", prefix]


async def _dead(broker: Broker, queue: str, n: int, error: str = "boom") -> list[int]:
    await broker.publish_batch(queue, [{"n": i} for i in range(n)])
    taken = await broker.engine.acquire([queue], n, 30)
    await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL, error=error)
                                for d in taken])
    return sorted(d.id for d in taken)


async def test_inspect_and_show_read_queues_and_messages(broker: Broker,
                                                         where: list[str]) -> None:
    (dead,) = await _dead(broker, "orders", 1, error="Traceback\n  ValueError: no")
    live = await broker.publish("orders", {"id": 7}, headers={"tenant": "a"})
    detail = json.loads((await cli("inspect", "orders", *where, "--json")).stdout)
    assert (detail["queue"], detail["pending"], detail["failed"]) == ("orders", 1, 1)
    assert detail["activity"]["1m"]["failed"] == 1 and detail["deliveries"] == {"0": 1}
    plain = await cli("inspect", "orders", *where)
    assert plain.returncode == 0 and "messages: pending 1" in plain.stdout

    missing = await cli("inspect", "nothing", *where)
    assert missing.returncode == 1
    assert missing.stderr.strip() == ("sqlmq: error: no queue named 'nothing' has messages, "
                                      "live or archived (queues: 'orders')")

    shown = json.loads((await cli("show", str(live), *where, "--json")).stdout)
    assert shown["payload"] == {"id": 7} and shown["headers"]["tenant"] == "a"
    assert shown["state"] == "PENDING" and shown["archived_at"] is None
    text = (await cli("show", str(dead), *where)).stdout
    assert "state: FAILED" in text and "ValueError: no" in text and "history:" in text
    assert (await cli("dlq", "show", str(dead), *where, "--json")).returncode == 0
    not_dead = await cli("dlq", "show", str(live), *where)
    assert not_dead.returncode == 1 and "is PENDING, not a dead letter" in not_dead.stderr
    gone = await cli("show", "999999", *where)
    assert gone.returncode == 1 and "no message 999999" in gone.stderr

    queues = json.loads((await cli("queues", *where, "--json")).stdout)
    assert [(q["queue"], q["pending"], q["failed"]) for q in queues] == [("orders", 1, 1)]


async def test_show_prints_the_result_a_subscriber_kept(broker: Broker,
                                                       where: list[str]) -> None:
    @broker.subscriber("thumbs", results=True, flush_interval=0.01)
    async def thumb(body: str) -> Any:
        return {"url": f"{body}.png"} if body != "raw" else b"\x01\x02"

    await broker.start()
    made = await broker.publish("thumbs", "cat")
    raw = await broker.publish("thumbs", "raw")
    await broker.result(made, timeout=20)
    await broker.result(raw, timeout=20)
    await broker.stop()
    text = (await cli("show", str(made), *where)).stdout
    assert 'result: {\n  "url": "cat.png"\n}' in text
    assert json.loads((await cli("show", str(made), *where, "--json")).stdout)["result"] == {
        "url": "cat.png"}
    assert "result (2 bytes, hex): 01 02" in (await cli("show", str(raw), *where)).stdout
    assert "result" not in (await cli("show", str(await broker.publish("q", 1)), *where)
                            ).stdout


async def test_publish_from_a_file_and_json_lines_on_stdin(
    broker: Broker, where: list[str], tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = tmp_path / "body.json"  # type: ignore[operator]
    body.write_text('{"from": "file"}')
    one = await cli("publish", "jobs", f"@{body}", *where, "--priority", "4")
    (row,) = await rows(broker, "message")
    assert row["id"] == int(one.stdout) and json.loads(row["payload"]) == {"from": "file"}
    assert row["priority"] == 4

    lines = "".join(f'{{"n": {i}}}\n' for i in range(1205)) + "\n"
    many = await _with_stdin(lines, "publish", "jobs", "-", *where, "--batch-size", "500")
    assert many.returncode == 0, many.stderr
    assert len(many.stdout.split()) == 1205 and "published 1205 message(s)" in many.stderr
    assert len(await rows(broker, "message")) == 1206

    bad = await _with_stdin('{"n": 1}\n{"n": 2}\nnot json\n{"n": 4}\n', "publish", "bad", "-",
                            *where, "--batch-size", "2")
    assert bad.returncode == 2
    assert "line 3 of stdin is not valid JSON" in bad.stderr
    assert "2 message(s) published before its batch, none after" in bad.stderr
    assert len(await rows(broker, "message", queue="bad")) == 2

    missing = await cli("publish", "jobs", "@/nonexistent/body.json", *where)
    assert missing.returncode == 2 and "cannot read the body" in missing.stderr


async def _with_stdin(text: str, *args: str) -> CliResult:
    def run() -> CliResult:
        with _STDIN_LOCK:
            saved, sys.stdin = sys.stdin, io.StringIO(text)
            try:
                return run_cli(*args)
            finally:
                sys.stdin = saved

    return await asyncio.to_thread(run)


_STDIN_LOCK = threading.Lock()


async def test_requeue_and_purge_in_batches_count_exactly(broker: Broker,
                                                          where: list[str]) -> None:
    """2,500 dead letters in three batches of 1,000: every one moved once, counted once."""
    dead = await _dead(broker, "big", 2500)
    await _dead(broker, "other", 3)
    out = await cli("dlq", "requeue", "--queue", "big", *where)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "requeued 2500 message(s)"
    back = await rows(broker, "message")
    assert sorted(r["id"] for r in back) == dead
    assert {r["state"] for r in back} == {"PENDING"}
    assert len(await rows(broker, "archive")) == 3

    await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL, error="again")
                                for d in await broker.engine.acquire(["big"], 2500, 30)])
    purged = await cli("dlq", "purge", "--queue", "big", *where)
    assert purged.stdout.strip() == "purged 2500 failed message(s)"
    assert [r["queue"] for r in await rows(broker, "archive")] == ["other"] * 3


async def test_purge_older_than_a_duration(broker: Broker, where: list[str]) -> None:
    await _dead(broker, "q", 2)
    await broker.publish("q", {"done": 1})
    (d,) = await broker.engine.acquire(["q"], 1, 30)
    await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.COMPLETE)])
    kept = await cli("purge", "--older-than", "1h", *where)
    assert kept.stdout.strip() == "purged 0 archived message(s)"
    await asyncio.sleep(1.1)  # the rows must be older than the cut, on the database clock
    only_failed = await cli("purge", "--older-than", "1s", "--state", "failed", *where)
    assert only_failed.stdout.strip() == "purged 2 archived message(s)"
    rest = await cli("purge", "--older-than", "1s", *where)
    assert rest.stdout.strip() == "purged 1 archived message(s)"
    assert await rows(broker, "archive") == []
    for bad, reason in (("7x", "is not a duration"), ("-3d", "must be zero or more")):
        refused = await cli("purge", "--older-than", bad, *where)
        assert refused.returncode == 2 and reason in refused.stderr
        assert len(refused.stderr.splitlines()) == 1
    missing = await cli("purge", *where)
    assert missing.returncode == 2 and "--older-than" in missing.stderr


async def test_dlq_watch_prints_new_dead_letters(broker: Broker, db_url: str,
                                                 prefix: str, db_kind: str) -> None:
    """A real ``sqlmq dlq watch`` process sees a dead letter archived after it started, and
    prints each once, though on PostgreSQL both its NOTIFY and a look at the archive (every
    0.1 s here) find it."""
    (old,) = await _dead(broker, "old", 1)  # archived before the watch, within its margin
    proc = await _watch(db_url, prefix, "--interval", "0.1", "--json")
    try:
        assert proc.stderr is not None and proc.stdout is not None
        started = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        assert "watching" in started
        how = (f"following NOTIFY on channel {prefix}dead_message (and scanning every 0.1s)"
               if db_kind == "postgresql" else "polling every 0.1s")
        assert how in started, started
        (new,) = await _dead(broker, "jobs", 1, error="fresh")
        seen: dict[int, dict[str, object]] = {}
        printed: list[tuple[int, object]] = []

        async def read() -> bool:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)  # type: ignore[union-attr]
            item = json.loads(line)
            seen[item["id"]] = item
            printed.append((item["id"], item["archived_at"]))
            return new in seen

        await wait_until(read, timeout=60)
        assert seen[new]["error"] == "fresh" and seen[new]["state"] == "FAILED"
        more = await _dead(broker, "jobs", 3, error="more")
        while not set(more) <= set(seen):
            await read()
        # Requeued, it dies again: a new dead letter, printed again.
        assert await broker.requeue(ids=[new]) == 1
        (d,) = await broker.engine.acquire(["jobs"], 1, 30)
        await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL,
                                               error="again")])
        while [i for i, _ in printed].count(new) < 2:
            await read()
        assert seen[new]["error"] == "again"
        with contextlib.suppress(TimeoutError):  # ten more looks at the archive: nothing new
            while True:
                await asyncio.wait_for(read(), 1.0)
        assert len(printed) == len(set(printed)), printed
        assert old not in seen, printed  # a restarted watch does not alert again
    finally:
        proc.terminate()
        await proc.wait()


async def test_dlq_watch_prints_what_commits_after_its_start(broker: Broker, db_url: str,
                                                             prefix: str) -> None:
    """The dead letters the archive holds when the watch starts are not printed, however
    recent; one whose transaction began before the start (so its archive time is earlier)
    and commits after it is printed, once; ``--since`` prints older ones on purpose."""
    before = await _dead(broker, "jobs", 3, error="before")
    (model,) = await rows(broker, "archive", id=before[0])
    late = {**model, "id": before[-1] + 100, "error": "in flight",
            "archived_at": await broker.engine.now() - timedelta(seconds=5)}
    async with broker.db.connect() as conn:
        await conn.begin()
        await conn.execute(insert(broker.schema.archive).values(**late))
        proc = await _watch(db_url, prefix, "--interval", "0.1", "--json")
        try:
            assert proc.stderr is not None and proc.stdout is not None
            assert "watching" in (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            await conn.commit()
            (after,) = await _dead(broker, "jobs", 1, error="after")
            printed = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))["id"]
                       for _ in range(2)]
            assert printed == [late["id"], after]
            with pytest.raises(TimeoutError):  # ten more looks at the archive: nothing more
                await asyncio.wait_for(proc.stdout.readline(), 1.0)
        finally:
            proc.terminate()
            await proc.wait()
    since = await _watch(db_url, prefix, "--interval", "0.1", "--json", "--since", "1h")
    try:
        assert since.stdout is not None
        shown = [json.loads(await asyncio.wait_for(since.stdout.readline(), 60))["id"]
                 for _ in range(5)]
        assert sorted(shown) == sorted([*before, late["id"], after])
    finally:
        since.terminate()
        await since.wait()


async def _watch(db_url: str, prefix: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sqlmq.cli", "dlq", "watch", "--url", db_url, "--prefix",
        prefix, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_dlq_watch_follows_the_notify_on_postgresql(broker: Broker, db_url: str,
                                                          prefix: str) -> None:
    """With a look at the archive once a minute, a fresh dead letter is printed within
    seconds: the watch follows the dead-letter NOTIFY. One deleted instead of archived
    (a subscriber's ``archive=``) is printed from the notification alone. Neither the
    start nor a reconnect prints one archived before the start, or one printed already."""
    await _dead(broker, "jobs", 2, error="before the start")
    proc = await _watch(db_url, prefix, "--interval", "60")
    try:
        assert proc.stderr is not None and proc.stdout is not None
        said: list[str] = []
        while not any("listening on channel" in line for line in said):  # LISTEN is on
            said.append((await asyncio.wait_for(proc.stderr.readline(), 60)).decode())
        assert f"following NOTIFY on channel {prefix}dead_message" in said[0], said
        assert f"listening on channel {prefix}dead_message" in said[-1], said
        loop = asyncio.get_running_loop()
        started = loop.time()
        (failed,) = await _dead(broker, "jobs", 1, error="Traceback\n  ValueError: fresh")
        line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
        assert line.startswith(f"FAILED\t{failed}\tjobs\t"), line
        assert line.rstrip().endswith("ValueError: fresh"), line
        waiting = await broker.publish("later", {"n": 1}, delay=3600)
        assert (await broker.cancel(waiting)).outcome == "cancelled"
        line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
        assert line.startswith(f"CANCELLED\t{waiting}\tlater\t"), line
        await broker.publish("jobs", {"n": 2})
        (gone,) = await broker.engine.acquire(["jobs"], 1, 30)
        assert await broker.engine.settle([Settlement(gone.id, gone.deliveries, Outcome.FAIL,
                                                      keep=False)]) == {gone.id}
        line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
        assert line == f"FAILED\t{gone.id}\tjobs\t(not in the archive)\n", line

        # Its listening connection killed: logged, reconnected, and the archive looked at.
        killer = await asyncpg.connect(PG_URL)
        try:
            assert await killer.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE query = $1", f'LISTEN "{prefix}dead_message"') == 1
        finally:
            await killer.close()
        (after,) = await _dead(broker, "jobs", 1, error="after the kill")
        while "again" not in said[-1]:
            said.append((await asyncio.wait_for(proc.stderr.readline(), 30)).decode())
        assert any("LISTEN on" in line and "failed" in line for line in said), said
        line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
        assert line.startswith(f"FAILED\t{after}\tjobs\t"), line
        assert loop.time() - started < 50  # all before the next periodic look (60 s)
        with pytest.raises(TimeoutError):  # the look after the reconnect printed no other
            await asyncio.wait_for(proc.stdout.readline(), 1.0)
    finally:
        proc.terminate()
        await proc.wait()


async def test_pause_resume_and_workers_from_the_command_line(broker: Broker,
                                                              where: list[str]) -> None:
    """``sqlmq workers`` lists this process's running broker; ``sqlmq pause`` stops it
    taking the queue's messages (published meanwhile, they wait) until ``sqlmq resume``."""
    done: list[int] = []

    @broker.subscriber("orders", max_fetch_interval=0.05, flush_interval=0.01)
    async def handle(msg: Message) -> None:
        done.append(msg.id)

    await broker.start()
    try:
        listed = await cli("workers", "--json", *where)
        assert listed.returncode == 0, listed.stderr
        (me,) = json.loads(listed.stdout)["workers"]
        assert (me["id"], me["pid"]) == (broker.worker_id, os.getpid())
        assert [s["queues"] for s in me["subscribers"]] == [["orders"]]

        paused = await cli("pause", "orders", *where)
        assert (paused.returncode, paused.stdout.strip()) == (0, "paused orders")
        again = await cli("pause", "orders", *where)
        assert again.stdout.strip() == "orders was paused already"
        shown = json.loads((await cli("workers", "--json", *where)).stdout)["paused"]
        assert [p["queue"] for p in shown] == ["orders"]
        waiting = await broker.publish("orders", {"n": 1})
        await asyncio.sleep(0.5)  # several polls: none takes it
        assert done == [] and (await rows(broker, id=waiting))[0]["state"] == "PENDING"

        resumed = await cli("resume", "orders", *where)
        assert (resumed.returncode, resumed.stdout.strip()) == (0, "resumed orders")
        await wait_until(lambda: done == [waiting], message="taken after the resume")
        assert (await cli("resume", "orders", *where)).stdout.strip() == "orders was not paused"
        bad = await cli("pause", "q" * 1000, *where)  # over the name limit
        assert bad.returncode == 2 and bad.stderr.startswith("sqlmq: error: queue name is 1000")
    finally:
        await broker.stop()
    after = json.loads((await cli("workers", "--json", *where)).stdout)
    assert after == {"workers": [], "paused": []}  # a stopped broker leaves the registry


def test_usage_errors_are_one_line_with_status_2() -> None:
    for args, reason in ((("show", "x", "--url", "sqlite:///nowhere.db"), "'x' is not a valid"),
                         (("queues", "--nope"), "No such option"),
                         (("dlq", "list", "--state", "weird", "--url", "sqlite:///x.db"),
                          "'weird' is not one of")):
        result = run_cli(*args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("sqlmq: error:") and reason in result.stderr
        assert len(result.stderr.splitlines()) == 1
