"""The relay's throughput and latency, PostgreSQL to RabbitMQ and to NATS JetStream.

    .venv/bin/python -m bench.run relay [--n 20000] [--repeat 3] [--targets amqp,nats]
                                        [--peer-workers 64,256,1024] [--rate 500]
                                        [--seconds 10] [--no-peer]
                                        [--no-latency | --no-throughput]
    (or: .venv/bin/python -m bench.relay …, the same options)

Throughput, per far broker, in the same rounds on the same servers (medians of ``--repeat``,
the cases of a round run one after another, their order rotated by one each round):

* sqlmq: ``Relay`` with its defaults drains ``--n`` messages of 64 bytes published (and
  ``ANALYZE``d) before it starts; timed from ``broker.start()`` until every message is
  archived.
* faststream-sqlbroker (the seed system, in bench/.venv-sqlbroker: ``bash bench/setup.sh``):
  its relay as its documentation shows it, a SqlBroker subscriber decorated with a
  FastStream RabbitMQ (publisher confirms, persistent) or JetStream publisher; timed until
  its message table is empty. Its ``max_workers`` is the best of ``--peer-workers``, found
  first by a sweep of ``--n / 4`` messages each.
* bare client: the same messages (body, message id, content type, the relay's ``sqlmq-id``
  and ``sqlmq-published-at`` headers, persistent) published straight from Python with no
  database, as many in flight as the relay's workers (256): through the client's fast path
  (aiormq's ``basic_publish(wait=False)`` under aio-pika, nats-py's ``publish_async``) and
  through its everyday call (aio-pika's ``Exchange.publish``, ``js.publish``); the better of
  the two in each round is the ceiling the ratios are taken to.
* sqlmq ``Relay`` to a target that confirms at once: sqlmq's own part (acquire, handler,
  settle), no far broker.

Every case publishes with confirmations (RabbitMQ: publisher confirms, persistent messages,
a durable queue; JetStream: the PubAck, a file stream), and is checked after: the far queue
or stream holds every message. Each row also gives the CPU its Python process used per
message (the far broker's and the database's are not in it).

Latency: one message published (one transaction each) every ``1 / --rate`` s for
``--seconds`` by a process of its own, the relay in another, a consumer of the far broker in
this one; from the moment the publishing transaction's commit returned to the message's
arrival at the consumer (same host, one clock), and from the publish call. The bare client
publishes straight to the far broker at the same rate: its figure is the floor.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlmq import Broker, Relay
from sqlmq.relay.relay import DEFAULT_WORKERS

from .common import BENCH, PAYLOAD, PG_URL, PREFIX, ROOT, drop_tables, median, percentile, table
from .pacing import STAMP, paced

AMQP_URL = os.environ.get("SQLMQ_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("SQLMQ_BENCH_NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("SQLMQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PEER_PYTHON = BENCH / ".venv-sqlbroker" / "bin" / "python"
PEER_SCRIPT = BENCH / "peer_sqlbroker.py"
PEER_PREFIX = f"benchfsb{os.getpid()}_"
NAME = f"bench-relay-{os.getpid()}"
QUEUE = "relay"
TARGETS = {"amqp": "RabbitMQ", "nats": "JetStream"}
WARMUP = 0.05  # the first 5 % of latency samples (connections, statements) are left out


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def log(line: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# ---- the far side -------------------------------------------------------------------------

class Destination:
    """A durable RabbitMQ queue or a JetStream file stream of this run, made empty (the
    stream made anew, so that its deduplication forgets the ids) before each case, deleted
    at the end."""

    def __init__(self, target: str, name: str = NAME) -> None:
        self.target = target
        self.name = name
        self.url = AMQP_URL if target == "amqp" else NATS_URL
        self.stream = name.upper().replace("-", "_")
        self.subject = f"{name}.out"
        self.options = ({"routing_key": name} if target == "amqp" else {"subject": self.subject})

    async def __aenter__(self) -> Destination:
        if self.target == "amqp":
            import aio_pika

            self.conn = await aio_pika.connect(AMQP_URL)
            self.channel = await self.conn.channel()
            self.queue = await self.channel.declare_queue(self.name, durable=True)
        else:
            import nats

            self.conn = await nats.connect(NATS_URL)
            self.js = self.conn.jetstream()
            await self._new_stream()
        return self

    async def _new_stream(self) -> None:
        import nats.js.errors

        try:
            await self.js.delete_stream(self.stream)
        except nats.js.errors.NotFoundError:
            pass
        await self.js.add_stream(name=self.stream, subjects=[f"{self.name}.>"])

    async def empty(self) -> None:
        if self.target == "amqp":
            await self.queue.purge()
        else:
            await self._new_stream()

    async def count(self) -> int:
        """Messages the queue or stream holds."""
        if self.target == "amqp":
            queue = await self.channel.declare_queue(self.name, passive=True)
            return int(queue.declaration_result.message_count or 0)
        return int((await self.js.stream_info(self.stream)).state.messages)

    async def check(self, n: int, who: str) -> None:
        got = await self.count()
        if got < n:
            raise RuntimeError(f"{who}: the far {TARGETS[self.target]} holds {got} of {n}")
        if got > n:
            log(f"{who}: the far side holds {got} messages for {n} sent (resends)")

    async def __aexit__(self, *exc: object) -> None:
        if self.target == "amqp":
            await self.queue.delete(if_unused=False, if_empty=False)
        else:
            await self.js.delete_stream(self.stream)
        await self.conn.close()


# ---- throughput ---------------------------------------------------------------------------

class InstantTarget:
    """A far broker that confirms at once: the relay's own cost, and its ceiling, with no far
    broker to wait for (each envelope's headers are made, as a real target makes them)."""

    name = "a target that confirms at once"

    async def open(self) -> None:
        pass

    def is_open(self) -> bool:
        return True

    async def send(self, envelope: Any) -> bool:
        envelope.id_headers()
        await asyncio.sleep(0)
        return False

    async def close(self) -> None:
        pass


async def relay_sqlmq(dest: Destination | None, n: int) -> tuple[float, float]:
    """Seconds for ``Relay``'s defaults to relay ``n`` waiting messages (to ``dest``, or to
    :class:`InstantTarget`), and the CPU seconds this process used meanwhile."""
    from .drain import analyze

    drop_tables(PG_URL)
    broker = Broker(PG_URL, table_prefix=PREFIX)
    try:
        await broker.migrate()
        relay = (Relay(broker, QUEUE, to=InstantTarget()) if dest is None else
                 Relay(broker, QUEUE, to=dest.url, **dest.options))
        for start in range(0, n, 10_000):
            await broker.publish_batch(QUEUE, [PAYLOAD] * min(10_000, n - start))
        await analyze(broker)
        cpu, started = cpu_seconds(), time.perf_counter()
        await broker.start()
        while sum(r.counters.completed for r in broker.runtimes) < n:
            await asyncio.sleep(0.005)
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        if relay.stats.sent < n or relay.stats.failed:
            log(f"sqlmq relay: {relay.stats}")
        return seconds, cpu
    finally:
        await broker.close()
        drop_tables(PG_URL)


CONTENT_TYPE = "application/octet-stream"  # a bytes body's, which the relay sends along


def _same_headers(i: int) -> dict[str, str]:
    """The headers the relay sends with a message: its content type, id and publish time."""
    now = datetime.now(UTC)
    return {"content-type": CONTENT_TYPE, "sqlmq-id": str(i),
            "sqlmq-published-at": now.isoformat(timespec="microseconds")}


async def bare_sender(target: str, subject: str, fast: bool
                      ) -> tuple[Callable[[int, bytes], Any], Callable[[], Any]]:
    """``send(i, payload)``, returning once the far broker confirmed message ``i``, and
    ``close()``: the bare client, no database."""
    if target == "amqp":
        import aio_pika
        from aiormq import spec

        conn = await aio_pika.connect(AMQP_URL)
        channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        if fast:
            frames = await channel.get_underlay_channel()

            async def send(i: int, payload: bytes) -> None:
                properties = spec.Basic.Properties(
                    content_type=CONTENT_TYPE, delivery_mode=2, headers=_same_headers(i),  # type: ignore[arg-type]
                    message_id=str(i), timestamp=datetime.now(UTC))
                await frames.basic_publish(payload, exchange="", routing_key=subject,
                                           properties=properties, mandatory=True, wait=False)
        else:
            exchange = channel.default_exchange

            async def send(i: int, payload: bytes) -> None:
                await exchange.publish(aio_pika.Message(
                    payload, message_id=str(i), headers=_same_headers(i),
                    content_type=CONTENT_TYPE,
                    timestamp=datetime.now(UTC),
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT), subject, mandatory=True)

        return send, conn.close
    import nats

    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    token = f"{os.getpid()}-{time.monotonic_ns()}-"

    async def send_nats(i: int, payload: bytes) -> None:
        headers = {**_same_headers(i), "Nats-Msg-Id": f"{token}{i}"}
        if fast:
            await (await js.publish_async(subject, payload, headers=headers))
        else:
            await js.publish(subject, payload, headers=headers)

    return send_nats, nc.close


async def relay_bare(dest: Destination, n: int, fast: bool,
                     in_flight: int = DEFAULT_WORKERS) -> tuple[float, float]:
    """Seconds for the bare client to send ``n`` messages with confirmations, ``in_flight``
    at once, no database; and its CPU seconds."""
    subject = dest.name if dest.target == "amqp" else dest.subject
    send, close = await bare_sender(dest.target, subject, fast)
    next_id = iter(range(1, n + 1))

    async def sender() -> None:
        for i in next_id:
            await send(i, PAYLOAD)

    cpu, started = cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(in_flight)))
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    await close()
    return seconds, cpu


def peer_run(*args: object, timeout: float = 1800) -> dict[str, Any]:
    """One role of bench/peer_sqlbroker.py in faststream-sqlbroker's own venv."""
    import subprocess

    if not PEER_PYTHON.exists():
        raise SystemExit("faststream-sqlbroker is not installed for the benchmark: run "
                         "bash bench/setup.sh")
    out = subprocess.run([str(PEER_PYTHON), str(PEER_SCRIPT), *map(str, args)],
                         env=peer_env(), capture_output=True, text=True, timeout=timeout,
                         check=False, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"faststream-sqlbroker {args[0]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def peer_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(BENCH_PG_DSN=PG_URL.replace("postgresql://", "postgresql+asyncpg://", 1),
               BENCH_PEER_PREFIX=PEER_PREFIX, BENCH_AMQP_URL=AMQP_URL, BENCH_NATS_URL=NATS_URL)
    return env


def relay_peer(dest: Destination, n: int, workers: int) -> tuple[float, float]:
    """Seconds for faststream-sqlbroker's relay (its own venv, its own tables), and the CPU
    seconds its process used meanwhile."""
    got = peer_run("relay", dest.target, dest.name, n, workers)
    return got["seconds"], got["cpu"]


async def peer_best(dest: Destination, n: int, workers: list[int]) -> tuple[int, list[Any]]:
    """faststream-sqlbroker's best ``max_workers`` of ``workers`` for ``dest``."""
    rows, best, best_rate = [], workers[-1], 0.0
    for w in workers:
        await dest.empty()
        seconds, _ = await asyncio.to_thread(relay_peer, dest, n, w)
        await dest.check(n, f"faststream-sqlbroker max_workers={w}")
        rate = n / seconds
        rows.append([f"max_workers={w}", rate])
        log(f"{dest.target} faststream-sqlbroker sweep max_workers={w}: {rate:,.0f} msg/s")
        if rate > best_rate:
            best, best_rate = w, rate
    return best, rows


async def throughput(target: str, n: int, repeat: int, peer_workers: list[int] | None
                     ) -> str:
    async with Destination(target) as dest:
        best, sweep = (None, [])
        if peer_workers:
            best, sweep = await peer_best(dest, max(1000, n // 4), peer_workers)
        cases: list[tuple[str, Any]] = [
            ("sqlmq Relay, defaults", lambda: relay_sqlmq(dest, n)),
            ("bare client, fast path", lambda: relay_bare(dest, n, fast=True)),
            ("bare client, everyday call", lambda: relay_bare(dest, n, fast=False)),
            ("sqlmq Relay to a target that confirms at once", lambda: relay_sqlmq(None, n)),
        ]
        if best is not None:
            cases.append((f"faststream-sqlbroker, max_workers={best}",
                          lambda: asyncio.to_thread(relay_peer, dest, n, best)))
        rounds: list[dict[str, tuple[float, float]]] = []
        for r in range(repeat):
            got: dict[str, tuple[float, float]] = {}
            for name, run in cases[r % len(cases):] + cases[:r % len(cases)]:
                await dest.empty()
                seconds, cpu = await run()
                if "at once" not in name:
                    await dest.check(n, name)
                got[name] = (n / seconds, 1e6 * cpu / n)
                log(f"{target} round {r + 1}: {name} {got[name][0]:,.0f} msg/s, "
                    f"{got[name][1]:.0f} µs CPU/msg")
            rounds.append(got)
    bare = (cases[1][0], cases[2][0])  # the ceiling: the better of the two in each round
    peer = cases[4][0] if best is not None else None
    rows = []
    for name, _ in cases:
        rates = [g[name][0] for g in rounds]
        of_bare = [g[name][0] / max(g[bare[0]][0], g[bare[1]][0]) for g in rounds]
        row = [name, median(rates), min(rates), max(rates), median([g[name][1] for g in rounds]),
               f"{100 * median(of_bare):.0f}% ({100 * min(of_bare):.0f}-"
               f"{100 * max(of_bare):.0f}%)"]
        row.append(f"{median([g[name][0] / g[peer][0] for g in rounds]):.2f}x" if peer else "")
        rows.append(row)
    text = table(f"relay PostgreSQL -> {TARGETS[target]}: {n:,} messages of 64 bytes, with "
                 f"confirmations, {repeat} rounds (msg/s; ratios within each round, then "
                 f"their median)",
                 ["who", "median", "min", "max", "client CPU µs/msg",
                  "of the better bare client", "vs faststream-sqlbroker"], rows)
    if sweep:
        text += "\n" + table(f"faststream-sqlbroker sweep, {max(1000, n // 4):,} messages each "
                             "(msg/s)", ["configuration", "msg/s"], sweep)
    return text


# ---- latency ------------------------------------------------------------------------------

async def spawn(*argv: str, peer: bool = False) -> asyncio.subprocess.Process:
    if peer:
        cmd = [str(PEER_PYTHON), str(PEER_SCRIPT), *argv]
        env = peer_env()
    else:
        cmd = [sys.executable, "-m", "bench.relay", *argv]
        env = dict(os.environ)
    return await asyncio.create_subprocess_exec(*cmd, cwd=ROOT, env=env,
                                                stdout=asyncio.subprocess.PIPE, limit=1 << 26)


async def read_json(proc: asyncio.subprocess.Process, key: str, timeout: float
                    ) -> dict[str, Any]:
    assert proc.stdout is not None

    async def read() -> dict[str, Any]:
        while True:
            line = await proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise RuntimeError(f"a latency process ended without reporting {key!r}")
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if key in data:
                return data  # type: ignore[no-any-return]

    return await asyncio.wait_for(read(), timeout)


async def far_consumer(dest: Destination, arrived: dict[str, float]) -> Callable[[], Any]:
    """Record each message's arrival (by the stamp its payload starts with) at a consumer of
    the far broker; returns what stops it."""
    if dest.target == "amqp":
        async def on_message(message: Any) -> None:
            arrived[message.body[:STAMP].decode()] = time.time()

        tag = await dest.queue.consume(on_message, no_ack=True)
        return lambda: dest.queue.cancel(tag)

    async def on_msg(msg: Any) -> None:
        arrived[msg.data[:STAMP].decode()] = time.time()

    sub = await dest.conn.subscribe(dest.subject, cb=on_msg)  # the stream stores it too
    return sub.unsubscribe


async def latency_case(dest: Destination, who: str, rate: float, seconds: float
                       ) -> dict[str, float]:
    """One latency run of ``who`` (sqlmq, peer or bare): p50/p99 commit -> arrival and
    publish call -> arrival, in ms."""
    await dest.empty()
    arrived: dict[str, float] = {}
    stop = await far_consumer(dest, arrived)
    procs: list[asyncio.subprocess.Process] = []
    peer = who == "peer"
    expected = int(rate * seconds)
    try:
        if who != "bare":
            relay = await spawn("serve", dest.target, dest.name, str(expected), PREFIX,
                                peer=peer)
            procs.append(relay)
            await read_json(relay, "ready", 120)
        role = "publish" if who != "bare" else "bare-publish"
        publisher = await spawn(role, dest.target, dest.name, str(rate), str(seconds), PREFIX,
                                peer=peer)
        procs.append(publisher)
        got = await read_json(publisher, "committed", 4 * seconds + 120)
        deadline = time.monotonic() + 60
        while len(arrived) < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        for p in procs:  # each ends by itself once its part is done, tables dropped
            try:
                await asyncio.wait_for(p.wait(), 30)
            except TimeoutError:
                p.terminate()
                await p.wait()
        await stop()
    committed: dict[str, float] = got["committed"]
    if len(arrived) < expected:
        raise RuntimeError(f"{who}: {len(arrived)} of {expected} messages arrived")
    order = sorted(committed, key=float)[int(len(committed) * WARMUP):]
    from_commit = [1000 * (arrived[s] - committed[s]) for s in order]
    from_call = [1000 * (arrived[s] - float(s)) for s in order]
    return {"p50": percentile(from_commit, 50), "p99": percentile(from_commit, 99),
            "call p50": percentile(from_call, 50), "call p99": percentile(from_call, 99),
            "rate": float(got["rate"])}


async def latency(target: str, rate: float, seconds: float, repeat: int, peer: bool) -> str:
    whos = ["sqlmq", "bare"] + (["peer"] if peer else [])
    names = {"sqlmq": "sqlmq Relay, defaults", "bare": "bare client (no database)",
             "peer": "faststream-sqlbroker, as in its docs"}
    results: dict[str, list[dict[str, float]]] = {w: [] for w in whos}
    async with Destination(target) as dest:
        for r in range(repeat):
            for who in whos[r % len(whos):] + whos[:r % len(whos)]:
                try:
                    results[who].append(await latency_case(dest, who, rate, seconds))
                except RuntimeError as exc:  # a gap in the table, the run goes on
                    log(f"{target} latency {who}: failed: {exc}")
                    continue
                g = results[who][-1]
                log(f"{target} latency round {r + 1} {who}: p50 {g['p50']:.1f} ms, p99 "
                    f"{g['p99']:.1f} ms")
    rows = []
    for who in whos:
        got = results[who]
        rows.append([names[who], *(median([g[k] for g in got])
                                   for k in ("p50", "p99", "call p50", "call p99", "rate")),
                     f"{min(g['p99'] for g in got):.1f}-{max(g['p99'] for g in got):.1f}"
                     if got else "-"])
    return table(f"relay latency PostgreSQL -> {TARGETS[target]} at {rate:g} msg/s for "
                 f"{seconds:g} s, one transaction per message, publisher, relay and far "
                 f"consumer in three processes (ms, median of {repeat}; first 5% left out)",
                 ["who", "commit->arrival p50", "p99", "publish call->arrival p50", "p99",
                  "achieved/s", "p99 range"], rows)


# ---- the processes of a latency run ------------------------------------------------------

def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def serve(target: str, name: str, expected: int, prefix: str) -> None:
    """The relay of a latency run: sqlmq's ``Relay`` with its defaults, until ``expected``
    messages were relayed (or SIGTERM)."""
    import signal

    dest = Destination(target, name)
    drop_tables(PG_URL, prefix)
    broker = Broker(PG_URL, table_prefix=prefix)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await broker.migrate()
        Relay(broker, QUEUE, to=dest.url, **dest.options)
        await broker.start()
        if broker.listener is not None:
            await asyncio.wait_for(broker.listener.connected.wait(), 30)
        emit(ready=True)
        deadline = time.monotonic() + 600
        while (sum(r.counters.completed for r in broker.runtimes) < expected
               and not stop.is_set() and time.monotonic() < deadline):
            await asyncio.sleep(0.1)
    finally:
        await broker.close()
        drop_tables(PG_URL, prefix)


async def publish(rate: float, seconds: float, prefix: str) -> None:
    """A transaction per message at ``rate``: the stamp each payload starts with, and the
    moment its commit returned."""
    broker = Broker(PG_URL, table_prefix=prefix)
    committed: dict[str, float] = {}
    await asyncio.gather(*(broker.publish(QUEUE + "-warmup", b"") for _ in range(8)))

    async def send(payload: bytes) -> None:
        await broker.publish(QUEUE, payload)
        committed[payload[:STAMP].decode()] = time.time()

    achieved = await paced(rate, seconds, send)
    await broker.close()
    emit(rate=achieved, committed=committed)


async def bare_publish(target: str, name: str, rate: float, seconds: float) -> None:
    """The floor: each message published straight to the far broker, its confirmation
    awaited (the 'commit' is the confirmation)."""
    dest = Destination(target, name)
    send, close = await bare_sender(target, name if target == "amqp" else dest.subject,
                                    fast=True)
    committed: dict[str, float] = {}
    count = iter(range(1, 10**9))

    async def one(payload: bytes) -> None:
        await send(next(count), payload)
        committed[payload[:STAMP].decode()] = time.time()

    achieved = await paced(rate, seconds, one)
    await close()
    emit(rate=achieved, committed=committed)


# ---- bench.run relay ---------------------------------------------------------------------

def run_relay(args: Any) -> str:
    from .run import _ints

    out = []
    targets = [t for t in args.targets.split(",") if t]
    peer_workers = None if args.no_peer else _ints(args.peer_workers)
    for target in targets:
        if target not in TARGETS:
            raise SystemExit(f"--targets: {target!r} is not one of {', '.join(TARGETS)}")
        if not args.no_throughput:
            out.append(asyncio.run(throughput(target, args.n, args.repeat, peer_workers)))
    if not args.no_latency:
        for target in targets:
            out.append(asyncio.run(latency(target, args.rate, args.seconds, args.repeat,
                                           not args.no_peer)))
    return "\n\n".join(out)


def main(argv: list[str]) -> None:
    role, *rest = argv
    if role == "serve":
        asyncio.run(serve(rest[0], rest[1], int(rest[2]), rest[3]))
    elif role == "publish":
        asyncio.run(publish(float(rest[2]), float(rest[3]), rest[4]))
    elif role == "bare-publish":
        asyncio.run(bare_publish(rest[0], rest[1], float(rest[2]), float(rest[3])))
    else:  # the benchmark itself, with bench.run's options
        from .run import main as run_main

        run_main(["relay", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
