"""The sqlmq command line, run as a real subprocess against each database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from datetime import time as clock_time
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from sqlmq import Broker
from sqlmq.records import NewMessage, NewMessages

from .conftest import CliResult, drop_tables, rows, run_cli
from .test_metrics import Samples, scrape, value

SQLMQ = [sys.executable, "-m", "sqlmq.cli"]


async def arun(*args: str) -> CliResult:
    """``run`` from an async test: the CLI runs its own event loop, so it gets a thread."""
    return await asyncio.to_thread(run, *args)


def run(*args: str, check: bool = True) -> CliResult:
    proc = run_cli(*args)
    if check and proc.returncode != 0:
        pytest.fail(f"sqlmq {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


@pytest.fixture
def cli_tables(db_url: str, prefix: str):  # type: ignore[no-untyped-def]
    yield
    drop_tables(db_url, prefix)


async def test_migrate_is_idempotent_and_records_the_version(
    db_url: str, prefix: str, cli_tables: None
) -> None:
    first = await arun("migrate", "--url", db_url, "--prefix", prefix)
    second = await arun("migrate", "--url", db_url, "--prefix", prefix)
    assert "schema at version" in first.stdout
    version = first.stdout.split("version")[1].split()[0]
    assert second.stdout.split("version")[1].split()[0] == version
    broker = Broker(db_url, table_prefix=prefix)
    try:
        await broker.check_schema()
    finally:
        await broker.close()


async def test_publish_queues_and_dlq_commands(db_url: str, prefix: str, cli_tables: None) -> None:
    await arun("migrate", "--url", db_url, "--prefix", prefix)
    out = await arun("publish", "--url", db_url, "--prefix", prefix, "orders", '{"id": 7}',
                     "--header", "tenant=a")
    msg_id = int(out.stdout.strip())
    broker = Broker(db_url, table_prefix=prefix)
    try:
        (row,) = await rows(broker, "message")
        assert row["id"] == msg_id and row["headers"]["tenant"] == "a"
        assert json.loads(row["payload"]) == {"id": 7}

        queues = json.loads(
            (await arun("queues", "--url", db_url, "--prefix", prefix, "--json")).stdout)
        assert [(q["queue"], q["pending"]) for q in queues] == [("orders", 1)]

        # Dead-letter it by hand through the engine contract, then list/requeue/purge.
        (d,) = await broker.engine.acquire(["orders"], 1, 30)
        from sqlmq import Outcome, Settlement

        await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL, error="boom")])
        listed = (await arun("dlq", "list", "--url", db_url, "--prefix", prefix)).stdout
        assert f"{msg_id}\torders" in listed and "boom" in listed
        requeued = await arun("dlq", "requeue", "--url", db_url, "--prefix", prefix,
                              "--queue", "orders")
        assert "requeued 1" in requeued.stdout
        (back,) = await rows(broker, "message")
        assert back["id"] == msg_id and back["state"] == "PENDING"
        assert back["deliveries_count"] == 0
        assert await rows(broker, "archive") == []
        (d,) = await broker.engine.acquire(["orders"], 1, 30)
        await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL, error="again")])
        purged = await arun("dlq", "purge", "--url", db_url, "--prefix", prefix,
                            "--queue", "orders")
        assert "purged 1" in purged.stdout
        assert await rows(broker, "archive") == []
    finally:
        await broker.close()


async def test_groups_and_topic_publish_commands(db_url: str, prefix: str,
                                                 cli_tables: None) -> None:
    await arun("migrate", "--url", db_url, "--prefix", prefix)
    broker = Broker(db_url, table_prefix=prefix)
    try:
        await broker.join_group("orders.*", "billing")
        await broker.join_group("#", "audit")
        out = await arun("publish", "--url", db_url, "--prefix", prefix, "--topic",
                         "orders.created", '{"id": 7}')
        fanout = json.loads(out.stdout)
        assert sorted(fanout) == ["audit@#", "billing@orders.*"]
        listed = json.loads((await arun("groups", "list", "--url", db_url, "--prefix", prefix,
                                         "--json")).stdout)
        assert [(g["pattern"], g["group"], g["queue"]) for g in listed] == [
            ("#", "audit", "audit@#"), ("orders.*", "billing", "billing@orders.*")]
        plain = (await arun("groups", "list", "--url", db_url, "--prefix", prefix)).stdout
        assert plain.splitlines()[1].startswith("orders.*\tbilling\tbilling@orders.*\t")
        gone = await arun("groups", "delete", "--url", db_url, "--prefix", prefix,
                          "orders.*", "billing")
        assert "and 1 message(s)" in gone.stdout
        assert [r["queue"] for r in await rows(broker, "message")] == ["audit@#"]
        again = await asyncio.to_thread(run_cli, "groups", "delete", "--url", db_url,
                                        "--prefix", prefix, "orders.*", "billing")
        assert again.returncode == 1 and again.stdout == ""
        assert again.stderr.strip() == ("sqlmq: error: no consumer group 'billing' of topic "
                                        "'orders.*' (groups: 'audit' of '#')")
        bad = await asyncio.to_thread(run_cli, "publish", "--url", db_url, "--prefix", prefix,
                                      "--topic", "a.*", "1")
        assert bad.returncode == 2 and "wildcard" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        await broker.close()


def test_requeue_without_a_filter_is_refused(db_url: str, prefix: str, cli_tables: None) -> None:
    run("migrate", "--url", db_url, "--prefix", prefix)
    proc = run("dlq", "requeue", "--url", db_url, "--prefix", prefix, check=False)
    assert proc.returncode == 2
    assert "needs --queue or --id" in proc.stderr


async def test_worker_runs_subscribers_until_sigterm(
    db_url: str, prefix: str, cli_tables: None, tmp_path: Path
) -> None:
    app = tmp_path / "cliapp.py"
    done = tmp_path / "done.txt"
    app.write_text(textwrap.dedent(f"""
        from sqlmq import Broker, Message
        broker = Broker({db_url!r}, table_prefix={prefix!r})

        @broker.subscriber("jobs", flush_interval=0.01)
        async def handle(msg: Message) -> None:
            with open({str(done)!r}, "a") as f:
                f.write(f"{{msg.id}}\\n")
    """))
    broker = Broker(db_url, table_prefix=prefix)
    try:
        await broker.migrate()
        ids = await broker.publish_batch("jobs", [{"n": n} for n in range(50)])
        port = _free_port()
        proc = subprocess.Popen([*SQLMQ, "worker", "cliapp:broker", "--metrics-port",
                                 str(port)], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(await rows(broker, "archive")) == 50:
                break
            await asyncio.sleep(0.1)
        # --metrics-port: the worker's own counts, and it leads (the only live worker). It
        # learns that it leads from its heartbeat's reading of the registry, which runs
        # beside the subscribers: on a loaded machine the 50 messages can be handled before
        # the first beat (or a retry of one that failed) has read it, so both are awaited.
        samples: Samples = {}
        while time.monotonic() < deadline and (value(
                samples, "sqlmq_messages_processed_total", queue="jobs") != 50
                or value(samples, "sqlmq_leader") != 1):
            with contextlib.suppress(OSError):
                samples = await scrape(port)
            await asyncio.sleep(0.1)
        assert value(samples, "sqlmq_messages_processed_total", queue="jobs") == 50
        assert value(samples, "sqlmq_leader") == 1
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        archived = await rows(broker, "archive")
        assert sorted(r["id"] for r in archived) == ids
        assert {r["state"] for r in archived} == {"COMPLETED"}
        assert sorted(int(x) for x in done.read_text().split()) == ids
    finally:
        await broker.close()


@pytest.mark.parametrize(("url", "status"), [
    ("redis://localhost/0", 2),
    ("not a url at all", 2),
    ("postgresql://alice:s3cr3t-pw@127.0.0.1:1/nowhere", 1),  # a usage error, and a failure
])
def test_bad_urls_fail_with_one_line_and_no_password(url: str, status: int) -> None:
    proc = run("queues", "--url", url, check=False)
    assert proc.returncode == status
    assert "s3cr3t-pw" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("sqlmq: error:")
    assert "Traceback" not in proc.stderr


def test_missing_url_is_a_clear_error() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SQLMQ_URL"}
    proc = subprocess.run([*SQLMQ, "queues"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 2
    assert "no database URL" in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_worker_refuses_something_that_is_not_a_broker(tmp_path: Path) -> None:
    (tmp_path / "notabroker.py").write_text("broker = 42\n")
    proc = subprocess.run([*SQLMQ, "worker", "notabroker:broker"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "is not a sqlmq Broker" in proc.stderr


async def test_schedules_command_lists_last_and_next_tick_and_deletes(
        db_url: str, prefix: str, cli_tables: None) -> None:
    await arun("migrate", "--url", db_url, "--prefix", prefix)
    broker = Broker(db_url, table_prefix=prefix)
    try:
        nightly = broker.periodic("nightly", cron="0 3 * * *", tz="Europe/Paris", body=1,
                                  queue="reports")
        await broker.engine.register_schedule(nightly)
        beat = broker.periodic("beat", every=60, body=1, catch_up="all")
        info = await broker.engine.register_schedule(beat)
        tick = beat.cadence.after(info.registered_at)

        async def produce() -> NewMessages:
            return NewMessages.of([NewMessage("beat", b"x", {})])

        msg_id = await broker.engine.fire_tick("beat", tick, produce)
        listed = json.loads((await arun("schedules", "--url", db_url, "--prefix", prefix,
                                         "--json")).stdout)
        assert [(s["name"], s["queue"], s["cadence"], s["catch_up"]) for s in listed] == [
            ("beat", "beat", "every 0:01:00", "all"),
            ("nightly", "reports", "cron '0 3 * * *' (Europe/Paris)", "latest")]
        assert (listed[0]["last_tick"], listed[0]["last_message_id"]) == (tick.isoformat(),
                                                                         msg_id)
        assert listed[0]["next_tick"] == (tick + timedelta(minutes=1)).isoformat()
        assert listed[1]["last_tick"] is None
        assert datetime.fromisoformat(listed[1]["next_tick"]).astimezone(
            ZoneInfo("Europe/Paris")).time() == clock_time(3, 0)
        plain = (await arun("schedules", "--url", db_url, "--prefix", prefix)).stdout
        assert plain.splitlines()[0].split("\t") == [
            "name", "queue", "cadence", "catch_up", "last tick", "message", "next tick"]
        assert plain.splitlines()[1].startswith(
            f"beat\tbeat\tevery 0:01:00\tall\t{tick.isoformat()}\t{msg_id}\t")
        gone = await arun("schedules", "--url", db_url, "--prefix", prefix, "--delete", "beat")
        assert "deleted schedule 'beat'" in gone.stdout
        again = await asyncio.to_thread(run_cli, "schedules", "--url", db_url, "--prefix",
                                        prefix, "--delete", "beat")
        assert again.returncode == 1 and again.stderr.strip() == (
            "sqlmq: error: no schedule named 'beat' (schedules: 'nightly')")
    finally:
        await broker.close()


async def test_cancel_command_answers_for_each_id(
        db_url: str, prefix: str, cli_tables: None) -> None:
    await arun("migrate", "--url", db_url, "--prefix", prefix)
    broker = Broker(db_url, table_prefix=prefix)
    try:
        running = await broker.publish("jobs", "r")
        waiting = await broker.publish("jobs", "w")
        await broker.engine.acquire(["jobs"], 1, 30)  # the oldest, ``running``, now runs
        listed = json.loads((await arun("cancel", "--url", db_url, "--prefix", prefix,
                                         str(waiting), "--json")).stdout)
        assert listed == [{"id": waiting, "outcome": "cancelled", "state": "CANCELLED"}]
        plain = await asyncio.to_thread(run_cli, "cancel", "--url", db_url, "--prefix",
                                        prefix, str(running), "999999", str(waiting))
        assert plain.returncode == 1 and plain.stdout.splitlines() == [
            f"message {running} is running: cancellation requested (its handler sees "
            "msg.cancel_requested; unless it succeeds it ends CANCELLED)",
            f"message {waiting} had already ended as CANCELLED: nothing to cancel"]
        # an unknown id is an error, on stderr like every command's, not a line of output
        assert plain.stderr.splitlines() == [
            "sqlmq: error: no message 999999 (not waiting, running or archived)"]
        assert await broker.engine.cancel_requests([running]) == {running}
        listed = await asyncio.to_thread(run_cli, "cancel", "--url", db_url, "--prefix",
                                         prefix, "999998", "--json")
        assert listed.returncode == 1 and json.loads(listed.stdout) == [
            {"id": 999998, "outcome": "unknown", "state": None}]
        assert listed.stderr.splitlines() == [
            "sqlmq: error: no message 999998 (not waiting, running or archived)"]
    finally:
        await broker.close()


async def test_channels_command_sets_lists_and_resets(
        db_url: str, prefix: str, cli_tables: None) -> None:
    await arun("migrate", "--url", db_url, "--prefix", prefix)
    broker = Broker(db_url, table_prefix=prefix)
    base = ("--url", db_url, "--prefix", prefix)
    try:
        await broker.publish("jobs", "a", channel="tenant-1")
        await broker.publish("jobs", "b", channel="tenant-1")
        await broker.publish("jobs", "c", channel="tenant-2")
        out = await arun("channels", "set", *base, "tenant-1", "--max-concurrency", "2",
                         "--rate", "5")
        assert out.stdout.strip() == "channel 'tenant-1': max_concurrency=2 rate=5.0"
        out = await arun("channels", "default", *base, "jobs", "--ordered")
        assert out.stdout.strip().endswith("ordered=True")
        await broker.engine.acquire(["jobs"], 10, 30)
        listed = {c["name"]: c for c in json.loads(
            (await arun("channels", "list", *base, "--json")).stdout)}
        assert (listed["tenant-1"]["own"], listed["tenant-1"]["max_concurrency"],
                listed["tenant-1"]["rate"]) == (True, 2, 5.0)
        assert (listed["tenant-2"]["own"], listed["tenant-2"]["ordered"]) == (False, True)
        running = sum(c["running"] for c in listed.values())
        waiting = sum(c["waiting"] for c in listed.values())
        assert (running, waiting) == (2, 1)  # tenant-1 by its rate, tenant-2 its head
        plain = await asyncio.to_thread(run_cli, "channels", "list", *base)
        assert plain.returncode == 0 and "(queue default)" in plain.stdout
        await arun("channels", "reset", *base, "tenant-1")
        (one,) = [c for c in await broker.channels() if c.name == "tenant-1"]
        assert one.settings is None and one.effective.ordered
        bad = await asyncio.to_thread(run_cli, "channels", "reset", *base, "nobody")
        assert bad.returncode != 0 and "no channel named 'nobody'" in bad.stderr
        bad = await asyncio.to_thread(run_cli, "channels", "set", *base, "x", "--rate", "-1")
        assert bad.returncode != 0 and "rate must be a positive number" in bad.stderr
    finally:
        await broker.close()
