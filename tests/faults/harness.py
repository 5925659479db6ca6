"""Worker processes for the fault tests and benchmarks, and the checks run on what they leave.

Workers are real OS processes started from a fork server that has already imported sqlmq,
SQLAlchemy and the drivers: a replacement is up in milliseconds instead of the seconds a
fresh interpreter needs on a loaded machine, so a driver can SIGKILL a worker every few
hundred milliseconds and keep four running.

Every handler execution is appended to the worker's own file as ``id delivery`` with one
unbuffered ``os.write`` (no fsync: the kernel keeps the line when the process is killed, which
is the fault under test). The files are the ground truth for duplicate executions.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.ext.asyncio import create_async_engine

from sqlmq import Broker, Message, build_schema
from sqlmq.connect import parse_url, sync_url
from sqlmq.schema import UTCDateTime
from sqlmq.sqltime import db_now_plus

from ..procs import fork_server


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker process runs. ``handler``: ``record`` (sleep, then record), ``poison``
    (a body ``"poison"`` kills the process with ``os._exit``), ``late_reject`` (sleep, then
    reject: with a lease shorter than the sleep, a write that must never land),
    ``slow_first`` (only the first delivery sleeps), ``pipeline`` (sleep, record, then return
    ``{"from": id}``, which a subscriber with ``publish_to`` publishes onward),
    ``channel_runs`` (write the start in :func:`runs_table`, sleep, write the end, record,
    then fail with probability ``fail``: a body is ``{"c": channel, ...}``), ``answer``
    (sleep, or the body's ``sleep_first`` on a first delivery, record, then return the
    message's id, body, delivery and the worker's pid, or raise the body's ``fail``: a
    subscriber with ``results=True`` keeps it), ``step`` (a workflow's step: sleep, then
    record, noting ``early`` if one of its dependencies had not completed, and return its
    id, or reject a body with ``fail``), ``await_signal`` (the first run records ``waits``
    and waits for signal ``go``, the next records ``got`` if the signal carried ``{"for":
    its id}``, else ``wrong``); ``batch`` and ``batch_pipeline`` are batch
    handlers (``batch=`` in ``subscriber``): sleep, record each message, and
    (``batch_pipeline``) return ``[{"from": id}, ...]``, one per message."""

    url: str
    prefix: str
    queue: str
    log_dir: str
    handler: str = "record"
    sleep: float = 0.0
    recovery_interval: float = 0.5
    recovery_spread: float = 1.0
    subscriber: dict[str, Any] = field(default_factory=dict)
    fail: float = 0.0


# ---- the worker side ----------------------------------------------------------------------


def run_worker(spec: WorkerSpec) -> None:
    """Process entry point: run one broker until SIGTERM, then write its counters."""
    _die_with_parent()
    log_dir = Path(spec.log_dir)
    err = os.open(log_dir / f"worker-{os.getpid()}.err", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(err, 2)
    asyncio.run(_serve(spec, log_dir))


def _die_with_parent() -> None:
    """A worker outlives a killed driver otherwise (its parent is the fork server, which
    exits with the driver): have the kernel SIGKILL it when that happens."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


async def _serve(spec: WorkerSpec, log_dir: Path) -> None:
    broker = Broker(spec.url, table_prefix=spec.prefix, recovery_interval=spec.recovery_interval,
                    recovery_spread=spec.recovery_spread)
    sink = os.open(log_dir / f"exec-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def record(msg: Message, note: str = "") -> None:
        os.write(sink, f"{msg.id} {msg.deliveries}{note}\n".encode())

    runs = runs_table(spec.prefix)
    # The runs' rows go through a pool of their own on the server databases: through the
    # broker's, every worker's handler held a connection of its own, and three tests of three
    # processes at once went past PostgreSQL's 100 ("too many clients": a handler failed
    # after writing its start, an execution the test could not place). SQLite's must share
    # the broker's engine, whose write turn orders its writers.
    runs_db = broker.db if broker.db.dialect.name == "sqlite" else create_async_engine(
        broker.db.url, pool_size=3, max_overflow=0)

    async def channel_run(msg: Message) -> None:
        async with runs_db.begin() as conn:
            run = (await conn.execute(insert(runs).values(
                channel=msg.body["c"], msg_id=msg.id, delivery=msg.deliveries,
                pid=os.getpid(), started_at=_DB_NOW))).inserted_primary_key[0]
        await asyncio.sleep(spec.sleep)
        async with runs_db.begin() as conn:
            await conn.execute(update(runs).where(runs.c.id == run).values(ended_at=_DB_NOW))
        record(msg)
        if random.random() < spec.fail:
            raise RuntimeError("a failure the test asked for")

    async def handle_batch(msgs: list[Message]) -> Any:
        await asyncio.sleep(spec.sleep)
        for msg in msgs:
            record(msg)
        if spec.handler == "batch_pipeline":
            return [{"from": msg.id} for msg in msgs]
        return None

    async def handle(msg: Message) -> Any:
        if spec.handler == "channel_runs":
            return await channel_run(msg)
        if spec.handler == "pipeline":
            await asyncio.sleep(spec.sleep)
            record(msg)
            return {"from": msg.id}
        if spec.handler == "answer":  # a results=True subscriber answering requests
            first = msg.deliveries == 1 and "sleep_first" in msg.body
            await asyncio.sleep(msg.body["sleep_first"] if first else spec.sleep)
            record(msg)
            if "fail" in msg.body:
                raise ValueError(msg.body["fail"])
            return {"id": msg.id, "echo": msg.body, "pid": os.getpid(),
                    "delivery": msg.deliveries}
        if spec.handler == "step":  # a workflow's step: its dependencies must have ended
            await asyncio.sleep(spec.sleep)
            deps = await msg.dependencies()
            early = [name for name, d in deps.items() if d.state != "COMPLETED"]
            record(msg, " early" if early else "")
            if isinstance(msg.body, dict) and msg.body.get("fail"):
                return await msg.reject("a failure the test asked for")
            return {"id": msg.id}
        if spec.handler == "await_signal":  # wait for signal "go" carrying its own id
            if msg.state is None:
                record(msg, " waits")
                return await msg.wait_for("go", timeout=300, state="waiting")
            got = await msg.signal()
            record(msg, " got" if got is not None and got.payload == {"for": msg.id}
                   else " wrong")
            return None
        if spec.handler == "poison" and msg.body == "poison":
            record(msg, " died")
            os._exit(3)
        if spec.handler == "late_reject":
            await asyncio.sleep(spec.sleep)
            record(msg, " late")
            await msg.reject("stale write")
            return
        if spec.handler != "slow_first" or msg.deliveries == 1:
            await asyncio.sleep(spec.sleep)
        record(msg)

    batches = spec.handler in ("batch", "batch_pipeline")
    broker.subscriber(spec.queue, **spec.subscriber)(handle_batch if batches else handle)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await broker.start()
    (log_dir / f"ready-{os.getpid()}").touch()
    await stop.wait()
    runtimes = broker.runtimes
    own_runs_db = runs_db is not broker.db
    await broker.close()
    if own_runs_db:
        await runs_db.dispose()
    counters = [asdict(r.counters) for r in runtimes]
    (log_dir / f"counters-{os.getpid()}.json").write_text(json.dumps(counters))


_DB_NOW = db_now_plus(literal(0.0))


def runs_table(prefix: str) -> Table:
    """Handler executions as the ``channel_runs`` handler records them, in the database and
    on its clock (the clock of leases and history entries): a start row before the handler's
    work, its end after. A SIGKILL leaves the end empty. A counter of running handlers
    cannot be kept instead: a killed handler never takes itself off."""
    return Table(
        f"{prefix}runs", MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("channel", String(100), nullable=False),
        Column("msg_id", BigInteger, nullable=False),
        Column("delivery", Integer, nullable=False),
        Column("pid", Integer, nullable=False),
        Column("started_at", UTCDateTime(), nullable=False),
        Column("ended_at", UTCDateTime()),
    )


# ---- the driver side ----------------------------------------------------------------------


class WorkerPool:
    """Starts, kills and replaces worker processes of one spec."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._ctx = fork_server()
        self.live: list[BaseProcess] = []
        self.kills = 0
        self.deaths = 0  # exits nobody asked for (crashes)

    def start(self, n: int = 1) -> None:
        for _ in range(n):
            p = self._ctx.Process(target=run_worker, args=(self.spec,), daemon=True)
            p.start()
            self.live.append(p)

    def kill_random(self) -> None:
        """SIGKILL one live worker and start its replacement."""
        self.kill(random.choice(self.live).pid or 0)

    def kill(self, pid: int) -> None:
        """SIGKILL the live worker ``pid`` and start its replacement."""
        (victim,) = [p for p in self.live if p.pid == pid]
        victim.kill()
        victim.join()
        self.live.remove(victim)
        self.kills += 1
        self.start()

    def replace_dead(self) -> int:
        dead = [p for p in self.live if not p.is_alive()]
        for p in dead:
            p.join()
            self.live.remove(p)
            self.deaths += 1
        self.start(len(dead))
        return len(dead)

    def check(self) -> None:
        """Fail at once if a worker exited that nobody stopped or killed, with the end of
        its stderr: a worker that cannot start (a missing table, an import error) otherwise
        left the test waiting out its timeout and saying only that nothing happened."""
        for p in self.live:
            if p.exitcode is not None:
                err = Path(self.spec.log_dir) / f"worker-{p.pid}.err"
                tail = err.read_text(errors="replace")[-3000:] if err.exists() else "(no .err)"
                raise AssertionError(f"worker {p.pid} exited with {p.exitcode} unasked; "
                                     f"the end of {err}:\n{tail}")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM everyone (graceful stop), SIGKILL whoever does not exit in time."""
        for p in self.live:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in self.live:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        self.live.clear()


def wait_ready(log_dir: Path, n: int, timeout: float = 60.0,
               watch: Sequence[WorkerPool] = ()) -> None:
    wait_for(lambda: len(list(log_dir.glob("ready-*"))) >= n, timeout,
             f"fewer than {n} workers became ready in {timeout}s; see {log_dir}/worker-*.err",
             watch)


def wait_for(condition: Callable[[], bool], timeout: float,
             failure: str | Callable[[], str], watch: Sequence[WorkerPool] = (),
             poll: float = 0.05) -> None:
    """Poll ``condition`` until it holds; after ``timeout`` seconds, fail with ``failure``
    (or what it returns, read then). A worker of the pools in ``watch`` that exits
    meanwhile fails it at once (:meth:`WorkerPool.check`)."""
    deadline = time.monotonic() + timeout
    while not condition():
        for pool in watch:
            pool.check()
        if time.monotonic() > deadline:
            raise AssertionError(failure if isinstance(failure, str) else failure())
        time.sleep(poll)


class Tables:
    """Sync access to one prefix's tables, for setup and for checking the outcome."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.schema = build_schema(prefix)
        self.db: SyncEngine = create_engine(sync_url(parse_url(url)))

    def migrate(self) -> None:
        async def go() -> None:
            async with Broker(self.url, table_prefix=self.prefix) as b:
                await b.migrate()

        asyncio.run(go())

    def publish(self, queue: str, bodies: Iterable[Any], chunk: int = 5000,
                **options: Any) -> list[int]:
        """Publish ``bodies`` in batches of ``chunk``, each with ``options`` (``channel=``)."""
        broker = Broker(self.db, table_prefix=self.prefix)
        ids: list[int] = []
        batch: list[Any] = []
        for body in bodies:
            batch.append(body)
            if len(batch) >= chunk:
                ids += broker.publish_batch_sync(queue, batch, **options)
                batch = []
        if batch:
            ids += broker.publish_batch_sync(queue, batch, **options)
        return ids

    def left(self, queue: str | None = None) -> int:
        """Messages in the table (of ``queue``, or of every queue)."""
        m = self.schema.message
        query = select(func.count()).select_from(m)
        if queue is not None:
            query = query.where(m.c.queue == queue)
        with self.db.connect() as conn:
            return conn.execute(query).scalar_one()

    def processing(self) -> int:
        m = self.schema.message
        with self.db.connect() as conn:
            return conn.execute(
                select(func.count()).select_from(m).where(m.c.state == "PROCESSING")
            ).scalar_one()

    def message_rows(self, queue: str | None = None) -> list[Any]:
        m = self.schema.message
        query = select(m.c.id, m.c.state, m.c.deliveries_count, m.c.payload)
        if queue is not None:
            query = query.where(m.c.queue == queue)
        with self.db.connect() as conn:
            return list(conn.execute(query))

    def archived(self) -> int:
        with self.db.connect() as conn:
            return conn.execute(select(func.count()).select_from(self.schema.archive)).scalar_one()

    def archive_rows(self) -> list[Any]:
        a = self.schema.archive
        with self.db.connect() as conn:
            return list(conn.execute(
                select(a.c.id, a.c.state, a.c.deliveries_count, a.c.attempts_count, a.c.error,
                       a.c.history, a.c.archived_at)
            ))

    def drop(self) -> None:
        self.schema.metadata.drop_all(self.db)
        self.db.dispose()


def executions(log_dir: Path) -> list[tuple[int, int, str]]:
    """Every recorded handler execution as ``(id, delivery, note)``."""
    out = []
    for path in log_dir.glob("exec-*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            out.append((int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else ""))
    return out


def lost_leases(log_dir: Path) -> set[tuple[int, int]]:
    """The deliveries ``(id, delivery)`` whose lease a worker that lived lost (its log's
    warning): ended by a process too slow to renew in time, not by a crash."""
    found = re.compile(r"lease of message (\d+) \(delivery (\d+)\) was lost")
    return {(int(m[1]), int(m[2])) for path in log_dir.glob("worker-*.err")
            for m in found.finditer(path.read_text(errors="replace"))}


def counters(log_dir: Path) -> Counter[str]:
    """The runtime counters of every worker that stopped gracefully, summed."""
    total: Counter[str] = Counter()
    for path in log_dir.glob("counters-*.json"):
        for c in json.loads(path.read_text()):
            total.update(c)
    return total


@dataclass
class Outcome:
    """What a run left behind, checked against what was published."""

    published: int
    archived: int
    left: int
    lost: int  # published, neither archived nor left
    double_archived: int
    completed: int
    executions: int
    duplicate_executions: int  # executions beyond the first, over all messages
    messages_executed_twice: int
    redelivered: int  # archived with deliveries_count > 1
    max_deliveries: int
    # Each must be 0:
    duplicates_without_redelivery: int  # executed twice, yet deliveries_count == 1
    executions_beyond_deliveries: int  # more executions than deliveries
    delivery_executed_twice: int  # the same (id, delivery) run twice
    completed_never_executed: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def assert_each_completed_once(self) -> None:
        """Every published message archived COMPLETED once, nothing left or lost, and no
        run without a delivery of its own behind it."""
        assert (self.archived, self.left, self.lost, self.double_archived) == (
            self.published, 0, 0, 0)
        assert self.completed == self.published
        assert self.completed_never_executed == 0
        assert self.duplicates_without_redelivery == 0
        assert self.executions_beyond_deliveries == 0
        assert self.delivery_executed_twice == 0


def outcome(tables: Tables, published: list[int], log_dir: Path,
            queue: str | None = None) -> Outcome:
    """What the run left of ``published`` (its messages are those of ``queue``, when other
    queues fill up beside it: a pipeline's outputs)."""
    rows = tables.archive_rows()
    by_id = {r.id: r for r in rows}
    runs = executions(log_dir)
    per_id = Counter(i for i, _, _ in runs)
    per_delivery = Counter((i, d) for i, d, _ in runs)
    pub = set(published)
    left = tables.left(queue)
    return Outcome(
        published=len(published),
        archived=len(rows),
        left=left,
        lost=len(pub - set(by_id)) - left,
        double_archived=len(rows) - len(by_id),
        completed=sum(1 for r in rows if r.state == "COMPLETED"),
        executions=len(runs),
        duplicate_executions=sum(n - 1 for n in per_id.values() if n > 1),
        messages_executed_twice=sum(1 for n in per_id.values() if n > 1),
        redelivered=sum(1 for r in rows if r.deliveries_count > 1),
        max_deliveries=max((r.deliveries_count for r in rows), default=0),
        duplicates_without_redelivery=sum(
            1 for i, n in per_id.items() if n > 1 and i in by_id and by_id[i].deliveries_count < 2
        ),
        executions_beyond_deliveries=sum(
            1 for i, n in per_id.items() if i in by_id and n > by_id[i].deliveries_count
        ),
        delivery_executed_twice=sum(1 for n in per_delivery.values() if n > 1),
        completed_never_executed=sum(
            1 for r in rows if r.state == "COMPLETED" and per_id[r.id] == 0
        ),
    )


def history(row: Any) -> list[dict[str, Any]]:
    value = row.history
    if isinstance(value, str | bytes):
        value = json.loads(value)
    return value or []


# ---- the kill driver ----------------------------------------------------------------------


@dataclass
class KillRun:
    kills: int
    seconds_under_fire: float  # from the first worker start to the last kill
    seconds_to_drain: float  # from the last kill until the queue was empty
    archived_under_fire: int
    outcome: Outcome


def kill_run(
    tables: Tables, spec: WorkerSpec, published: list[int], *, workers: int = 4,
    min_kills: int = 50, interval: tuple[float, float] = (0.15, 0.35),
    until_drained: bool = False, timeout: float = 600.0,
    top_up: Callable[[], list[int]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> KillRun:
    """Run ``workers`` processes on the queue and SIGKILL a random one every ``interval``
    seconds (starting a replacement at once) for ``min_kills`` kills, or until the queue is
    empty with ``until_drained``; then let the survivors drain it and stop them gracefully.

    If the queue runs low before ``min_kills``, ``top_up`` publishes more (its ids join
    ``published``), so the kills always land on a working queue."""
    log_dir = Path(spec.log_dir)
    pool = WorkerPool(spec)
    started = time.monotonic()
    deadline = started + timeout
    pool.start(workers)
    try:
        wait_ready(log_dir, 1, watch=[pool])
        while pool.kills < min_kills or (until_drained and tables.left(spec.queue) > 0):
            if top_up and pool.kills < min_kills and tables.left(spec.queue) < 200:
                published += top_up()
            if time.monotonic() > deadline:
                raise AssertionError(f"{pool.kills} kills after {timeout}s, "
                                     f"{tables.left(spec.queue)} messages left")
            time.sleep(random.uniform(*interval))
            pool.kill_random()
            pool.replace_dead()
            if progress and pool.kills % 25 == 0:
                progress(f"{pool.kills} kills, {tables.archived()} archived, "
                         f"{tables.left(spec.queue)} left")
        fired = time.monotonic()
        under_fire = tables.archived()
        while tables.left(spec.queue) > 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"queue not drained after {timeout}s "
                                     f"({tables.left(spec.queue)} left, {pool.kills} kills)")
            pool.replace_dead()
            time.sleep(0.1)
        drained = time.monotonic()
    finally:
        pool.stop()
    return KillRun(pool.kills, fired - started, drained - fired, under_fire,
                   outcome(tables, published, log_dir, spec.queue))
