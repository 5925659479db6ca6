"""Worker processes for the process-level tests, and the test-side helpers that drive them.

A worker is a real OS process running ``asyncio.run(broker.run())``, the same path
``sqlmq worker`` takes, forked from a server that has sqlmq imported already (or started as
a given command, such as ``sqlmq worker tests.procs:broker``). It is configured through
environment variables (so that ``sqlmq worker tests.procs:broker``, ``python -m
tests.procs`` and a forked worker build the same broker) and appends the id of every
message its handler finished to its own file, one line each, written at once. The files
outlive the process, so a test can tell exactly which process handled what, even after a
SIGTERM.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import IO

from sqlmq import Broker, Message

ROOT = Path(__file__).resolve().parent.parent

ENV_URL = "SQLMQ_PROCS_URL"
ENV_PREFIX = "SQLMQ_PROCS_PREFIX"
ENV_QUEUE = "SQLMQ_PROCS_QUEUE"
ENV_OUT = "SQLMQ_PROCS_OUT"
ENV_SLEEP = "SQLMQ_PROCS_SLEEP"  # seconds each handler call takes
ENV_LEASE = "SQLMQ_PROCS_LEASE"  # the subscriber's lease, seconds
ENV_GROUP = "SQLMQ_PROCS_GROUP"  # set: the queue is a topic pattern, consumed as this group
ENV_EVERY = "SQLMQ_PROCS_EVERY"  # set: also run the schedule "beat" every this many seconds
ENV_CATCH_UP = "SQLMQ_PROCS_CATCH_UP"  # the schedule's catch-up policy
ENV_HEARTBEAT = "SQLMQ_PROCS_HEARTBEAT"  # the broker's heartbeat_interval, seconds
#: The queue of the schedule "beat": no subscriber takes its messages.
BEAT = "beat"


def build_broker(
    url: str, prefix: str, queue: str, out: Path, sleep: float = 0.0, lease: float = 30.0,
    group: str | None = None, every: float | None = None, catch_up: str = "latest",
    heartbeat: float = 5.0,
) -> Broker:
    """A broker with one subscriber that records every id it handled in ``out``; with
    ``group``, a subscriber of the topic pattern ``queue`` in that consumer group. With
    ``every``, it also runs the schedule ``beat``, whose messages (the publishing process's
    pid) stay in the queue :data:`BEAT`. ``heartbeat``: its row in the live workers registry
    is written every so many seconds."""
    broker = Broker(url, table_prefix=prefix, recovery_interval=0.5,
                    heartbeat_interval=heartbeat)
    sink: IO[str] = open(out, "a", buffering=1)

    # A short idle poll so that an idle process notices new work quickly: other processes'
    # publishes do not wake it.
    consumes: dict[str, str] = {"topic": queue, "group": group} if group else {"queues": queue}

    @broker.subscriber(**consumes, max_fetch_interval=0.2, graceful_timeout=30.0, lease=lease)
    async def record(msg: Message) -> None:
        if sleep:
            await asyncio.sleep(sleep)
        sink.write(f"{msg.id}\n")

    if every is not None:
        broker.periodic(BEAT, every=every, catch_up=catch_up)(  # type: ignore[arg-type]
            lambda: {"pid": os.getpid()})
    return broker


def _broker_from_env() -> Broker | None:
    if ENV_URL not in os.environ:
        return None
    return build_broker(
        os.environ[ENV_URL], os.environ[ENV_PREFIX], os.environ[ENV_QUEUE],
        Path(os.environ[ENV_OUT]), float(os.environ.get(ENV_SLEEP, "0")),
        float(os.environ.get(ENV_LEASE, "30")), os.environ.get(ENV_GROUP) or None,
        float(os.environ[ENV_EVERY]) if os.environ.get(ENV_EVERY) else None,
        os.environ.get(ENV_CATCH_UP) or "latest",
        float(os.environ.get(ENV_HEARTBEAT) or "5"),
    )


#: What ``sqlmq worker tests.procs:broker`` runs (None outside a worker process).
broker = _broker_from_env()


def ready_marker(out: Path) -> Path:
    return out.with_name(out.name + ".ready")


async def _main() -> None:
    assert broker is not None, f"set {ENV_URL} and friends to run a worker"
    out = Path(os.environ[ENV_OUT])

    async def mark_ready() -> None:
        while not broker.runtimes:
            await asyncio.sleep(0.01)
        ready_marker(out).touch()

    marker = asyncio.create_task(mark_ready())
    try:
        await broker.run()
    finally:
        marker.cancel()


# ---- the test side ---------------------------------------------------------------------------


def worker_env(
    url: str, prefix: str, queue: str, out: Path, sleep: float = 0.0, lease: float = 30.0,
    group: str | None = None, every: float | None = None, catch_up: str = "latest",
    heartbeat: float = 5.0,
) -> dict[str, str]:
    return {
        **os.environ,
        ENV_URL: url, ENV_PREFIX: prefix, ENV_QUEUE: queue, ENV_OUT: str(out),
        ENV_SLEEP: str(sleep), ENV_LEASE: str(lease), ENV_GROUP: group or "",
        ENV_EVERY: "" if every is None else str(every), ENV_CATCH_UP: catch_up,
        ENV_HEARTBEAT: str(heartbeat),
        "PYTHONPATH": str(ROOT),
    }


#: What the tests' fork server imports once, so that a forked process starts with it loaded
#: (a new interpreter spent 2-3 s of CPU importing sqlmq and its drivers, on a busy 2-core
#: machine). multiprocessing keeps one fork server per test process, started by whichever
#: test forks first, so every user's modules are in this one list.
PRELOAD = ["tests.procs", "tests.faults.harness", "sqlmq.broker",
           "sqlalchemy.dialects.postgresql.asyncpg", "sqlalchemy.dialects.mysql.asyncmy",
           "sqlalchemy.dialects.sqlite.aiosqlite", "sqlalchemy.dialects.sqlite.pysqlite",
           "asyncpg", "asyncmy", "aiosqlite"]


def fork_server() -> ForkServerContext:
    """multiprocessing's fork-server context, preloading :data:`PRELOAD`. Each child re-runs
    the parent's main script: under pytest that imports pytest, a second of CPU for each
    child unless the server has it already."""
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(PRELOAD + (["pytest"] if "pytest" in sys.modules else []))
    return forks


class ForkedWorker:
    """A worker process forked from the fork server, with the part of ``Popen`` the tests
    use (a worker given its own ``command`` is a ``Popen``)."""

    def __init__(self, process: BaseProcess) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode  # negative: the signal that ended it, as Popen's

    def poll(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
        return self._process.exitcode


Worker = ForkedWorker | subprocess.Popen[bytes]


def _forked_main(env: dict[str, str], log: str) -> None:
    """A forked worker: its output to ``log``, configured from ``env`` as ``python -m
    tests.procs`` is from its environment."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    global broker
    broker = _broker_from_env()
    asyncio.run(_main())


def spawn_worker(
    url: str, prefix: str, queue: str, out: Path, sleep: float = 0.0, lease: float = 30.0,
    command: list[str] | None = None, group: str | None = None, every: float | None = None,
    catch_up: str = "latest", heartbeat: float = 5.0,
) -> Worker:
    """Start a worker process, forked from a server that has sqlmq imported, or running
    ``command`` (``sqlmq worker tests.procs:broker``); its output goes to ``out`` + ``.log``
    for post-mortems."""
    env = worker_env(url, prefix, queue, out, sleep, lease, group, every, catch_up, heartbeat)
    log = out.with_name(out.name + ".log")
    if command is None:
        # daemon: one a test left running is stopped when the test process exits, instead
        # of that exit waiting for it
        process = fork_server().Process(target=_forked_main, args=(env, str(log)),
                                        daemon=True)
        process.start()
        return ForkedWorker(process)
    with open(log, "ab") as sink:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink,
                                stderr=subprocess.STDOUT)


def terminate(proc: Worker, timeout: float = 60.0) -> int:
    """SIGTERM and wait; SIGKILL (and report -9) only if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -signal.SIGKILL


def handled_ids(out: Path) -> list[int]:
    """The ids a worker recorded, in order, duplicates kept."""
    if not out.exists():
        return []
    return [int(line) for line in out.read_text().split()]


def worker_log(out: Path) -> str:
    path = out.with_name(out.name + ".log")
    return path.read_text(errors="replace")[-4000:] if path.exists() else ""


if __name__ == "__main__":
    asyncio.run(_main())
