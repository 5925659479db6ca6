"""The command line on bad input and at its edges: a clear error, the right exit status
(2: a usage error, 1: the work failed), and nothing lost."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sqlmq import Broker, Outcome, Settlement

from .conftest import CliResult, drop_tables, rows, run_cli

SQLMQ = [sys.executable, "-m", "sqlmq.cli"]


async def cli(*args: str) -> CliResult:
    return await asyncio.to_thread(run_cli, *args)


@pytest.fixture
async def dead_letters(broker: Broker) -> list[int]:
    """Two dead letters in ``orders`` (one with a multi-line error) and one in ``refunds``."""
    await broker.publish_batch("orders", [{"n": 1}, {"n": 2}])
    await broker.publish("refunds", {"n": 3})
    ids = []
    for queue, error in (("orders", "Traceback:\n  line 1\n\tValueError: boom"),
                         ("orders", "plain"), ("refunds", "plain")):
        (d,) = await broker.engine.acquire([queue], 1, 30)
        await broker.engine.settle([Settlement(d.id, d.deliveries, Outcome.FAIL, error=error)])
        ids.append(d.id)
    return ids


@pytest.fixture
def where(db_url: str, prefix: str) -> list[str]:
    """The CLI arguments naming the ``broker`` fixture's database and tables."""
    return ["--url", db_url, "--prefix", prefix]


async def test_malformed_json_is_refused_unless_text_is_asked_for(
    broker: Broker, where: list[str]
) -> None:
    bad = await cli("publish", *where, "orders", "{id: 7")
    assert bad.returncode == 2
    assert "not valid JSON" in bad.stderr and "--text" in bad.stderr
    assert await rows(broker, "message") == []
    ok = await cli("publish", *where, "orders", "{id: 7", "--text")
    assert ok.returncode == 0, ok.stderr
    (row,) = await rows(broker, "message")
    assert bytes(row["payload"]) == b"{id: 7"
    assert row["headers"]["content-type"].startswith("text/plain")


async def test_requeue_of_a_missing_id_fails_and_requeues_nothing(
    broker: Broker, dead_letters: list[int], where: list[str]
) -> None:
    missing = max(dead_letters) + 1000
    result = await cli("dlq", "requeue", *where, "--id", str(dead_letters[0]),
                       "--id", str(missing))
    assert result.returncode == 1
    assert f"no dead letter with id {missing}" in result.stderr
    assert len(await rows(broker, "archive")) == 3
    ok = await cli("dlq", "requeue", *where, "--id", str(dead_letters[0]))
    assert ok.returncode == 0 and "requeued 1" in ok.stdout


async def test_purge_needs_a_filter_or_all_yes(
    broker: Broker, dead_letters: list[int], where: list[str]
) -> None:
    for args, message in ((), "needs --queue"), (("--all",), "--yes"):
        refused = await cli("dlq", "purge", *where, *args)
        assert refused.returncode == 2, refused.stderr
        assert message in refused.stderr
    negative = await cli("dlq", "purge", *where, "--older-than", "-1")
    assert negative.returncode == 2 and "must be zero or more" in negative.stderr
    assert len(await rows(broker, "archive")) == 3
    one_queue = await cli("dlq", "purge", *where, "--queue", "refunds")
    assert "purged 1" in one_queue.stdout
    everything = await cli("dlq", "purge", *where, "--all", "--yes")
    assert "purged 2" in everything.stdout
    assert await rows(broker, "archive") == []


async def test_dlq_list_keeps_one_line_per_dead_letter_and_has_json(
    broker: Broker, dead_letters: list[int], where: list[str]
) -> None:
    plain = await cli("dlq", "list", *where)
    lines = plain.stdout.splitlines()
    assert len(lines) == 3
    assert all(len(line.split("\t")) == 6 for line in lines)
    assert any("Traceback:\\n  line 1\\n\\tValueError: boom" in line for line in lines)
    listed = json.loads((await cli("dlq", "list", *where, "--json")).stdout)
    assert sorted(d["id"] for d in listed) == sorted(dead_letters)
    assert "Traceback:\n  line 1\n\tValueError: boom" in {d["error"] for d in listed}


async def test_piped_queues_shows_whole_queue_names(broker: Broker, where: list[str]) -> None:
    name = "tenant-" + "x" * 100 + "-orders"
    await broker.publish(name, {"n": 1})
    result = await cli("queues", *where)
    assert result.returncode == 0, result.stderr
    header, line = result.stdout.splitlines()
    assert header.split("\t")[:2] == ["queue", "pending"]
    assert line.split("\t")[:2] == [name, "1"]


async def test_a_reader_that_stops_reading_is_no_database_error(
        broker: Broker, where: list[str]) -> None:
    """``sqlmq show ID --json | head -c 20``: the command stops quietly (click's exit 1 on a
    broken pipe), not with a "database error" naming the pipe."""
    msg_id = await broker.publish("big", {"blob": "x" * 2_000_000})

    def run() -> tuple[int, str]:
        proc = subprocess.Popen([*SQLMQ, "show", str(msg_id), "--json", *where],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(20).startswith(b'{"id": ')
        proc.stdout.close()  # as head does
        err = proc.stderr.read().decode()
        return proc.wait(timeout=60), err

    status, err = await asyncio.to_thread(run)
    assert status == 1 and "error" not in err, err


def test_a_database_error_exits_1_and_a_usage_error_2() -> None:
    down = run_cli("queues", "--url", "postgresql://app:pw@127.0.0.1:1/app")
    assert down.returncode == 1 and down.stderr.startswith("sqlmq: error:")
    usage = run_cli("dlq", "requeue", "--url", "postgresql://app:pw@127.0.0.1:1/app")
    assert usage.returncode == 2


def test_report_help_without_pyspark_is_a_one_line_hint() -> None:
    code = ("import sys; sys.modules['pyspark'] = None\n"
            "from sqlmq.cli import main\nraise SystemExit(main(['report', '--help']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "pip install 'sqlmq[spark]'" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args", [("--processes", "0"), ("--messages", "0"),
                                  ("--processes", "-3")])
def test_demo_refuses_counts_below_one(args: tuple[str, str], tmp_path: Path) -> None:
    result = run_cli("demo", "--url", f"sqlite:///{tmp_path}/demo.db", *args)
    assert result.returncode == 2
    assert "must be at least 1" in result.stderr


def test_demo_database_errors_are_one_line() -> None:
    result = run_cli("demo", "--url", "postgresql://app:pw@127.0.0.1:1/app")
    assert result.returncode == 1
    assert result.stderr.startswith("sqlmq: error:") and len(result.stderr.splitlines()) == 1
    assert "pw@" not in result.stderr


async def test_worker_logs_start_signal_drain_and_stop(
    db_url: str, prefix: str, tmp_path: Path
) -> None:
    if db_url.startswith("postgresql://postgres@"):  # trust authentication: any password
        db_url = db_url.replace("postgresql://postgres@", "postgresql://postgres:hunter2@")
    app = tmp_path / "logapp.py"
    app.write_text(textwrap.dedent(f"""
        from sqlmq import Broker, Retry
        broker = Broker({db_url!r}, table_prefix={prefix!r})

        @broker.subscriber("jobs", workers=3, lease=12, retry=Retry.constant(2, max_attempts=4))
        async def handle(body: dict) -> None:
            pass
    """))
    broker = Broker(db_url, table_prefix=prefix)
    try:
        await broker.migrate()
        proc = subprocess.Popen([*SQLMQ, "worker", "logapp:broker"], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        await broker.publish("jobs", {"n": 1})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(await rows(broker, "archive")) < 1:
            await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        await broker.close()
        drop_tables(db_url, prefix)
    assert proc.returncode == 0, err
    assert "hunter2" not in err
    assert f"sqlmq worker started on {broker.url}" in err
    assert "subscriber handle on jobs: workers=3" in err and "lease=12s" in err
    assert "received SIGTERM: stopping" in err
    assert "draining: 0 handler(s) running" in err
    assert "sqlmq worker stopped after" in err and "1 completed" in err


@pytest.mark.parametrize(("argv0", "on_path", "expected"), [
    (".venv/bin/sqlmq", False, ".venv/bin/sqlmq"),       # ./dev demo: not on PATH
    ("sqlmq-not-a-script.py", False, "-m sqlmq.cli"),    # python -m / an embedding program
    ("{venv}/sqlmq", True, "sqlmq"),                     # an activated virtualenv
])
def test_the_demo_hint_names_a_command_that_runs(
    argv0: str, on_path: bool, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlmq.demo import sqlmq_command

    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "sqlmq").write_text("#!/bin/sh\n")
    (venv / "sqlmq").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(venv) if on_path else "/nonexistent")
    command = sqlmq_command(argv0.format(venv=venv))
    assert command.endswith(expected)
    assert command != "sqlmq" or on_path
