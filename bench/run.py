"""The benchmark's one command.

    .venv/bin/python -m bench.run drain|publish|latency|all [--db postgresql|mariadb|sqlite|all]
    .venv/bin/python -m bench.run fresh --db postgresql [--rate 500 --load-seconds 60]
                                    [--analyzed-empty]
    .venv/bin/python -m bench.run workers --db postgresql [--workers 1,4,16,64,256]
    .venv/bin/python -m bench.run processes --db postgresql [--processes 1,2,4]
    .venv/bin/python -m bench.run held [--held-rate 2000 --held-seconds 300 --hold-at 60
                                    --hold 180]
    .venv/bin/python -m bench.run channels --db all [--n 20000 --channels 1000]
                                    [--cases plain,spread,ordered,mixed,limited,fairness]
    .venv/bin/python -m bench.run relay [--n 20000] [--targets amqp,nats] [--rate 500]
                                    [--seconds 10] [--peer-workers 64,256,1024]
                                    [--no-latency | --no-throughput]
    .venv/bin/python -m bench.run inbox [--n 20000] [--sources amqp,nats,redis]
    .venv/bin/python -m bench.run peers [--n 30000] [--contenders sqlmq,pgqueuer,...]
                                    [--waldump]

Prints one table per benchmark (medians over ``--repeat`` rounds; ratios are taken within
each round, then their median), followed by the command line that reproduces it. Run
``bash bench/setup.sh`` once first (PGQueuer in bench/.venv-pgqueuer, py-spy/pyinstrument).
Every table the run creates carries its own prefix (``bench<pid>_``) and is dropped after.
``relay`` and ``inbox`` (PostgreSQL; RabbitMQ, NATS JetStream and Redis on this host) compare
with faststream-sqlbroker in bench/.venv-sqlbroker, which bench/setup.sh also builds.
``peers`` (PostgreSQL) drains beside PGQueuer, graphile-worker and pg-boss (bench/node/, which
bench/setup.sh installs with npm) and reports what each drain cost the database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import sys
import time
from functools import partial
from typing import Any

from .common import DATABASES, median, percentile, table

DEFAULT_N = 100_000
#: ``--n`` of the benchmarks whose far broker takes a few thousand messages a second.
FAR_N = {"relay": 20_000, "inbox": 20_000, "peers": 30_000}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["drain", "publish", "latency", "fresh", "workers",
                                    "processes", "held", "channels", "relay", "inbox",
                                    "peers", "all"])
    p.add_argument("--db", default="all", choices=[*DATABASES, "all"])
    p.add_argument("--n", type=int, default=None,
                   help=f"messages per drain ({DEFAULT_N:,}; relay and inbox: 20,000; "
                        "peers: 30,000)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    p.add_argument("--peer-batches", default="10,100,500",
                   help="PGQueuer batch sizes to try (the best is reported)")
    p.add_argument("--peer-procs", default="1,2", help="PGQueuer worker processes to try")
    p.add_argument("--sweep-n", type=int, default=20_000,
                   help="messages per PGQueuer configuration in the search for its best")
    p.add_argument("--rates", default="100,2000", help="latency: messages per second")
    p.add_argument("--seconds", type=float, default=10.0, help="latency: publishing time")
    p.add_argument("--rate", type=float, default=500.0,
                   help="fresh and relay's latency: messages per second")
    p.add_argument("--load-seconds", type=float, default=60.0, help="fresh: publishing time")
    p.add_argument("--analyzed-empty", action="store_true",
                   help="fresh: ANALYZE the empty table first (a queue that drained)")
    p.add_argument("--batch-total", type=int, default=200_000,
                   help="publish: messages sent in batches")
    p.add_argument("--single-count", type=int, default=2000,
                   help="publish: messages sent one transaction each")
    p.add_argument("--no-peer", action="store_true", help="skip PGQueuer")
    p.add_argument("--confirm", type=int, default=5,
                   help="workers: pairs of defaults and the sweep's best drain run again")
    p.add_argument("--workers", default="1,4,16,64,256",
                   help="workers: the worker counts to sweep")
    p.add_argument("--processes", default="1,2,4",
                   help="processes: the worker process counts to try")
    p.add_argument("--held-rate", type=float, default=2000.0, help="held: messages per second")
    p.add_argument("--held-seconds", type=float, default=300.0, help="held: publishing time")
    p.add_argument("--hold-at", type=float, default=60.0,
                   help="held: seconds into the run when the transaction opens")
    p.add_argument("--hold", type=float, default=180.0,
                   help="held: seconds the transaction stays open")
    p.add_argument("--channels", type=int, default=1000,
                   help="channels: how many channels the spread drains use")
    p.add_argument("--cases", default=",".join(CHANNEL_CASES),
                   help="channels: which runs, of " + ",".join(CHANNEL_CASES))
    p.add_argument("--subscriber-defaults", action="store_true",
                   help="channels: drain plain, spread, ordered and mixed with "
                        "@broker.subscriber's defaults instead of the drain's tuned options")
    p.add_argument("--targets", default="amqp,nats",
                   help="relay: the far brokers, of amqp (RabbitMQ) and nats (JetStream)")
    p.add_argument("--sources", default="amqp,nats,redis",
                   help="inbox: the far brokers, of amqp, nats and redis (Redis Streams)")
    p.add_argument("--peer-workers", default="64,256,1024",
                   help="relay: faststream-sqlbroker max_workers to try (the best is run)")
    p.add_argument("--no-latency", action="store_true", help="relay: throughput only")
    p.add_argument("--no-throughput", action="store_true", help="relay: latency only")
    p.add_argument("--contenders", default=None,
                   help="peers: which drains, of sqlmq, sqlmq-delete, pgqueuer, graphile-fast, "
                        "graphile-default, pg-boss (all)")
    p.add_argument("--waldump", action="store_true",
                   help="peers: read each drain's WAL back with pg_waldump (its own bytes, by "
                        "record type and relation)")
    args = p.parse_args(argv)
    if args.n is None:
        args.n = FAR_N.get(args.what, DEFAULT_N)
    return args


#: The runs of ``channels``.
CHANNEL_CASES = ("plain", "spread", "ordered", "mixed", "deep", "limited", "fairness")


def dbs(args: argparse.Namespace) -> list[str]:
    return list(DATABASES) if args.db == "all" else [args.db]


# ---- drain ---------------------------------------------------------------------------------

def run_drain(args: argparse.Namespace) -> str:
    from .drain import LIMIT_BATCH, SQLMQ_DRAIN, drain_limit, drain_pgqueuer, drain_sqlmq

    out = []
    for db in dbs(args):
        best, sweep_rows = pgqueuer_best(args, db)
        rounds: list[dict[str, float]] = []
        for r in range(args.repeat):
            got: dict[str, float] = {}
            got["sqlmq"] = args.n / asyncio.run(drain_sqlmq(db, args.n))
            _log(f"{db} round {r + 1}: sqlmq {got['sqlmq']:,.0f} msg/s")
            if best is not None:
                got["pgqueuer"] = args.n / drain_pgqueuer(args.n, *best)
                _log(f"{db} round {r + 1}: pgqueuer {got['pgqueuer']:,.0f} msg/s")
            if db == "postgresql":
                got["limit"] = args.n / asyncio.run(drain_limit(args.n))
                _log(f"{db} round {r + 1}: in-database limit {got['limit']:,.0f} msg/s")
            rounds.append(got)
        rows: list[list[Any]] = []
        for key, label in (("sqlmq", "sqlmq"), ("pgqueuer", "PGQueuer (best config)"),
                           ("limit", "in-database limit (server-side loop)")):
            values = [g[key] for g in rounds if key in g]
            if values:
                rows.append([label, median(values), min(values), max(values)])
        ratios = []
        if any("pgqueuer" in g for g in rounds):
            ratios.append(["sqlmq / PGQueuer",
                           f"{median([g['sqlmq'] / g['pgqueuer'] for g in rounds]):.2f}x"])
        if any("limit" in g for g in rounds):
            ratios.append(["sqlmq / in-database limit",
                           f"{100 * median([g['sqlmq'] / g['limit'] for g in rounds]):.0f}%"])
        text = table(f"drain on {db}: {args.n:,} messages of 64 bytes, no-op handler, "
                     f"{args.repeat} rounds (msg/s)",
                     ["contender", "median", "min", "max"], rows)
        if ratios:
            text += "\n" + table("ratios (median of per-round ratios)", ["", "value"], ratios)
        cfg = ", ".join(f"{k}={v}" for k, v in SQLMQ_DRAIN.items())
        text += f"\nsqlmq config: one process, {cfg}"
        if best is not None:
            text += (f"\nPGQueuer config: batch_size={best[0]}, processes={best[1]} (best of "
                     f"the sweep below, {args.sweep_n:,} jobs each)\n")
            text += "\n" + table("PGQueuer sweep (msg/s)", ["configuration", "msg/s"], sweep_rows)
        if db == "postgresql":
            text += (f"\nin-database limit: sqlmq's acquire and settle statements in a "
                     f"plpgsql DO loop, {LIMIT_BATCH} per batch, COMMIT after each")
        out.append(text)
    return "\n\n".join(out)


def pgqueuer_best(args: argparse.Namespace, db: str
                  ) -> tuple[tuple[int, int] | None, list[tuple[str, float]]]:
    """PGQueuer's best (batch size, processes) on PostgreSQL, and the sweep that found it."""
    from .drain import drain_pgqueuer

    if db != "postgresql" or args.no_peer:
        return None, []
    best: tuple[int, int] | None = None
    best_rate = 0.0
    sweep_rows = []
    for procs in _ints(args.peer_procs):
        for batch in _ints(args.peer_batches):
            rate = args.sweep_n / drain_pgqueuer(args.sweep_n, batch, procs)
            sweep_rows.append((f"batch_size={batch}, processes={procs}", rate))
            _log(f"pgqueuer sweep batch={batch} procs={procs}: {rate:,.0f} msg/s")
            if rate > best_rate:
                best, best_rate = (batch, procs), rate
    return best, sweep_rows


# ---- publish -------------------------------------------------------------------------------

def run_publish(args: argparse.Namespace) -> str:
    from .publish import BATCH_SIZE, LARGE_BATCH_SIZE, publish_batches, publish_single

    rows = []
    for db in dbs(args):
        singles = [asyncio.run(publish_single(db, args.single_count))
                   for _ in range(args.repeat)]
        batches, large = [], []
        for _ in range(args.repeat):  # interleaved, so both sizes see the same noise
            batches.append(asyncio.run(publish_batches(db, args.batch_total)))
            large.append(asyncio.run(publish_batches(db, args.batch_total, LARGE_BATCH_SIZE)))
        _log(f"{db}: single {median(singles):,.0f} msg/s, batch {median(batches):,.0f} msg/s, "
             f"large batch {median(large):,.0f} msg/s")
        rows.append([db, median(singles), median(batches), median(large)])
    return table(f"publish (msg/s, median of {args.repeat}): single = one transaction per "
                 f"message, awaited in turn ({args.single_count:,}); batch = publish_batch of "
                 f"{BATCH_SIZE:,}, large batch = publish_batch of {LARGE_BATCH_SIZE:,} "
                 f"({args.batch_total:,} in all for each)",
                 ["database", "single", "batch", "large batch"], rows)


# ---- latency -------------------------------------------------------------------------------

def run_latency(args: argparse.Namespace) -> str:
    from .latency import (
        latency_pgqueuer,
        latency_sqlmq,
        latency_sqlmq_in_process,
        publishers_for,
    )

    rows = []
    for db in dbs(args):
        for rate in _ints(args.rates):
            secs = args.seconds
            procs = f"{1 + publishers_for(rate)} processes"
            cases: list[tuple[str, Any]] = [
                (f"sqlmq, {procs}", partial(_sync, latency_sqlmq, db, rate, secs)),
            ]
            if db == "postgresql" and not args.no_peer:
                cases.append((f"PGQueuer, {procs}", partial(latency_pgqueuer, rate, secs)))
            else:
                cases.append(("sqlmq, 1 process",
                              partial(_sync, latency_sqlmq_in_process, db, rate, secs)))
            results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in cases}
            for _ in range(args.repeat):
                for name, fn in cases:  # interleaved, so both see the same machine noise
                    try:
                        results[name].append(fn())
                    except RuntimeError as exc:  # reported as a gap, the run goes on
                        _log(f"{db} {rate}/s {name}: failed: {exc}")
                        continue
                    _log(f"{db} {rate}/s {name}: p50 {results[name][-1]['p50']:.1f} ms")
            for name, got in results.items():
                rows.append([db, rate, name,
                             median([g["p50"] for g in got]), median([g["p95"] for g in got]),
                             median([g["p99"] for g in got]), median([g["rate"] for g in got])])
    return table(f"latency publish -> handler start (ms, median over {args.repeat} runs of "
                 f"{args.seconds:g} s; first 5% of samples left out)",
                 ["database", "rate/s", "who", "p50", "p95", "p99", "achieved/s"], rows)


# ---- fresh table ---------------------------------------------------------------------------

def run_fresh(args: argparse.Namespace) -> str:
    from .fresh_table import WINDOW, fresh_table

    seconds = args.load_seconds
    out = []
    for db in dbs(args):
        rows, tail = asyncio.run(fresh_table(db, args.rate, seconds, args.analyzed_empty))
        _log(f"{db}: fresh table at {args.rate:g}/s done")
        out.append(table(
            f"fresh table on {db}: {args.rate:g} msg/s for {seconds:g} s from one process to "
            f"a no-op subscriber on freshly migrated tables"
            f"{' (ANALYZE while empty)' if args.analyzed_empty else ''}; pickup = publish "
            f"call -> handler start (ms), per {WINDOW:g} s window",
            ["window", "picked up", "p50", "p99", "max", "acquires", "mean acquire ms"], rows)
            + f"\nmessage table at the end: {tail}")
    return "\n\n".join(out)


# ---- workers sweep -------------------------------------------------------------------------

def run_workers(args: argparse.Namespace) -> str:
    from .drain import drain_pgqueuer
    from .workers import HANDLERS, default_workers, drain_with, messages_for, sweep_cases

    out = []
    for db in dbs(args):
        best_peer, sweep_rows = pgqueuer_best(args, db)
        cases = [(handler, sleep, label, options,
                  messages_for(sleep, int(options.get("workers", default_workers())), args.n))
                 for handler, sleep in HANDLERS.items()
                 for label, options in sweep_cases(_ints(args.workers))]
        rates: dict[int, list[float]] = {i: [] for i in range(len(cases))}
        peer_rates: list[float] = []
        for r in range(args.repeat):
            # Rounds, so that every case sees the same noise, each starting one case later:
            # a drain runs faster or slower for what ran just before it (PGQueuer's dropped
            # tables, a checkpoint), and no case should always come first.
            order = list(range(len(cases)))
            order = order[r % len(order):] + order[:r % len(order)]
            for i in order:
                handler, sleep, label, options, n = cases[i]
                rates[i].append(asyncio.run(drain_with(db, n, options, sleep)))
                _log(f"{db} round {r + 1} {handler} {label}: {rates[i][-1]:,.0f} msg/s")
            if best_peer is not None:
                peer_rates.append(args.n / drain_pgqueuer(args.n, *best_peer))
                _log(f"{db} round {r + 1} pgqueuer: {peer_rates[-1]:,.0f} msg/s")
        rows: list[list[Any]] = []
        for i, (handler, _, label, _, n) in enumerate(cases):
            rows.append([handler, label, n, median(rates[i]), min(rates[i]), max(rates[i])])
        for handler in HANDLERS:
            best = max(r[3] for r in rows if r[0] == handler)
            for r in rows:
                if r[0] == handler:
                    r.append(f"{100 * r[3] / best:.0f}%")
        confirmation = _confirm_best(args, db, cases, rows)
        text = table(
            f"workers sweep on {db}: drain with only the options shown (the rest default), "
            f"one process, median of {args.repeat} rounds (msg/s; share of the handler's "
            f"best)", ["handler", "options", "messages", "median", "min", "max", "of best"],
            rows)
        if peer_rates:
            defaults = rates[0]
            text += "\n" + table(
                f"PGQueuer, best of the sweep (batch_size={best_peer[0]}, "  # type: ignore[index]
                f"processes={best_peer[1]}), in the same rounds",  # type: ignore[index]
                ["", "value"],
                [["PGQueuer msg/s (median)", median(peer_rates)],
                 ["sqlmq defaults / PGQueuer (median of per-round ratios)",
                  f"{median([d / p for d, p in zip(defaults, peer_rates, strict=True)]):.2f}x"]])
            text += "\n" + table("PGQueuer sweep (msg/s)", ["configuration", "msg/s"], sweep_rows)
        out.append(text + confirmation)
    return "\n\n".join(out)


def _confirm_best(args: argparse.Namespace, db: str, cases: list[tuple[Any, ...]],
                  rows: list[list[Any]]) -> str:
    """The defaults against the sweep's best no-op configuration again, in ``--confirm``
    pairs, each pair's order alternating: the median of the pairs' ratios. The best of
    eight medians is biased upwards on a noisy machine (the one that drew the luckiest
    rounds wins); a paired ratio is not."""
    from .workers import drain_with

    if args.confirm < 1:
        return ""
    noop = [i for i, c in enumerate(cases) if not c[1]]
    best = max(noop, key=lambda i: rows[i][3])
    if best == noop[0]:
        return "\n(no-op: the defaults were the sweep's best; no confirmation needed)"
    _, sleep, label, options, n = cases[best]
    ratios = []
    for r in range(args.confirm):
        pair = [({}, "defaults"), (options, label)]
        got = {}
        for opts, name in (pair if r % 2 == 0 else pair[::-1]):
            got[name] = asyncio.run(drain_with(db, n, opts, sleep))
            _log(f"{db} confirmation {r + 1} {name}: {got[name]:,.0f} msg/s")
        ratios.append(got["defaults"] / got[label])
    return "\n" + table(
        f"no-op defaults against the sweep's best ({label}), {args.confirm} pairs, each "
        f"pair's order alternating (defaults / best per pair)",
        ["", "value"],
        [["median of the pairs' ratios", f"{100 * median(ratios):.0f}%"],
         ["lowest / highest pair", f"{100 * min(ratios):.0f}% / {100 * max(ratios):.0f}%"]])


# ---- channels ------------------------------------------------------------------------------

def run_channels(args: argparse.Namespace) -> str:
    from .channels import LIMITED_WORKERS, drain_rate, fairness
    from .drain import SQLMQ_DRAIN

    limited, limit, sleep = 8, 2, 0.01
    expected = limited * limit / sleep
    # A few ordered channels with deep backlogs: each runs one message at a time, so at
    # best the number of channels over the handler's time. Deep enough that an acquire
    # reading the backlogs behind the running heads shows (it did before the ordered
    # window: 10 of 2,000 ran at 83-219 msg/s).
    deep, deep_n, deep_sleep, deep_workers = 10, 10_000, 0.005, 16
    deep_expected = deep / deep_sleep
    cases = _channel_cases(args.cases)
    tuned = not args.subscriber_defaults
    runs: dict[str, Any] = {
        "plain": lambda db: drain_rate(db, args.n, tuned=tuned),
        "spread": lambda db: drain_rate(db, args.n, args.channels, tuned=tuned),
        "ordered": lambda db: drain_rate(db, args.n, args.channels, tuned=tuned, ordered=True),
        "mixed": lambda db: drain_rate(db, args.n, args.channels, tuned=tuned, mixed=True,
                                       ordered=True),
        "deep": lambda db: drain_rate(db, deep_n, deep, deep_sleep,
                                      {"workers": deep_workers}, ordered=True),
        "limited": lambda db: drain_rate(
            db, int(expected * 5), limited, sleep,
            {"workers": LIMITED_WORKERS, "fetch_batch": LIMITED_WORKERS,
             "prefetch": LIMITED_WORKERS}, max_concurrency=limit),
    }
    out = []
    for db in dbs(args):
        rounds: list[dict[str, float]] = []
        for r in range(args.repeat):
            got = {case: asyncio.run(runs[case](db)) for case in cases if case in runs}
            if "fairness" in cases:
                indices = asyncio.run(fairness(db))
                got["jain_min"], got["jain_mean"] = min(indices), sum(indices) / len(indices)
            rounds.append(got)
            _log(f"{db} round {r + 1}: " + ", ".join(f"{k} {v:,.2f}" for k, v in got.items()))

        def med(key: str, rounds: list[dict[str, float]] = rounds) -> float:
            return median([g[key] for g in rounds])

        def ratio(key: str, rounds: list[dict[str, float]] = rounds) -> str:
            return f"{100 * median([g[key] / g['plain'] for g in rounds]):.0f}%"

        every = {  # the case: its label, its share (of plain, of the limits), its target
            "plain": ("plain drain (no channel)", lambda: "100%", ""),
            "spread": (f"{args.channels:,} channels, no limits", lambda: ratio("spread"),
                       ">= 80%"),
            "ordered": (f"{args.channels:,} ordered channels", lambda: ratio("ordered"),
                        ">= 70%"),
            "mixed": (f"{args.channels:,} ordered channels, published in turn",
                      lambda: ratio("mixed"), ">= 70%"),
            "deep": (f"{deep} ordered channels x {deep_n // deep:,}, "
                     f"{deep_sleep * 1000:.0f} ms handlers, {deep_workers} workers",
                     lambda: f"{100 * med('deep') / deep_expected:.0f}% of "
                             f"{deep_expected:,.0f}", "(one at a time per channel)"),
            "limited": (f"{limited} channels x max_concurrency={limit}, "
                        f"{sleep * 1000:.0f} ms handlers",
                        lambda: f"{100 * med('limited') / expected:.0f}% of {expected:,.0f}",
                        "100% of the sum of limits"),
        }
        rows = [[label, med(case), share(), target]
                for case, (label, share, target) in every.items() if case in cases]
        text = table(f"channels on {db}: drains of {args.n:,} messages of 64 bytes (the "
                     f"limited run {int(expected * 5):,}), no-op handler unless said, "
                     f"{args.repeat} rounds (msg/s)",
                     ["run", "median msg/s", "vs plain", "target"], rows) if rows else ""
        if "fairness" in cases:
            text += (f"\nfairness: 10 channels, backlogs 100,000 : 100 (x9), 4 workers, 20 ms "
                     f"handlers, no limits: Jain's index per 1 s window while all had work: "
                     f"min {med('jain_min'):.3f}, mean {med('jain_mean'):.3f} (target >= 0.9)")
        cfg = ", ".join(f"{k}={v}" for k, v in SQLMQ_DRAIN.items())
        if not tuned:
            cfg = f"the subscriber's defaults (deep and limited runs: {cfg})"
        text += f"\nsqlmq config: one process, {cfg}; limited runs: {LIMITED_WORKERS} workers"
        out.append(text)
    return "\n\n".join(out)


def _channel_cases(given: str) -> list[str]:
    """``--cases`` checked; ``plain`` added where a ratio to it is asked for (the ratios
    are taken within each round)."""
    cases = [c.strip() for c in given.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CHANNEL_CASES))
    if unknown:
        raise SystemExit(f"unknown --cases {', '.join(unknown)}: choose from "
                         f"{', '.join(CHANNEL_CASES)}")
    if {"spread", "ordered", "mixed"} & set(cases) and "plain" not in cases:
        cases.insert(0, "plain")
    return cases


# ---- processes curve -----------------------------------------------------------------------

def run_processes(args: argparse.Namespace) -> str:
    from .processes import PROBE_EVERY, Drained, drain_processes

    out = []
    for db in dbs(args):
        counts = _ints(args.processes)
        got: dict[int, list[Drained]] = {c: [] for c in counts}
        for r in range(args.repeat):  # rounds, so that every count sees the same noise
            for c in counts:
                got[c].append(asyncio.run(drain_processes(db, args.n, c)))
                _log(f"{db} round {r + 1} processes={c}: {got[c][-1].rate:,.0f} msg/s, "
                     f"shares {got[c][-1].shares}, cpu {got[c][-1].cpu}")
        one = median([g.rate for g in got[counts[0]]])
        rows = []
        for c in counts:
            rates = [g.rate for g in got[c]]
            cpu = {k: median([g.cpu[k] for g in got[c]]) for k in ("machine", "workers", "rest")}
            shares = got[c][len(got[c]) // 2].shares
            took = sorted(t * 1000 for g in got[c] for t in g.publishes)
            rows.append([c, median(rates), min(rates), max(rates),
                         f"{median(rates) / one:.2f}x", f"{cpu['machine']:.2f}",
                         f"{cpu['workers']:.2f}", f"{cpu['rest']:.2f}",
                         " / ".join(f"{100 * x / sum(shares):.0f}%" for x in shares),
                         f"{percentile(took, 50):.2f} / {percentile(took, 99):.1f} / "
                         f"{took[-1]:.1f}"])
        out.append(table(
            f"processes curve on {db}: {args.n:,} messages drained by N processes, each one "
            f"subscriber on the defaults, no-op handler, median of {args.repeat} rounds; CPU "
            f"in cores of {os.cpu_count()} (the rest: the database and the orchestrator); a "
            f"single publish from the orchestrator every {PROBE_EVERY * 1000:.0f} ms while "
            f"the backlog lasts, its ms (all rounds)",
            ["processes", "msg/s", "min", "max", "vs 1", "CPU all", "CPU workers",
             "CPU rest", "share per process", "publish p50 / p99 / max"], rows))
    return "\n\n".join(out)


# ---- sustained load with a held transaction -------------------------------------------------

def run_held(args: argparse.Namespace) -> str:
    from .held_xact import RESULTS, held_transaction, plot

    rows, summary = asyncio.run(held_transaction(args.held_rate, args.held_seconds,
                                                 args.hold_at, args.hold))
    png = RESULTS / f"held-xact-{time.strftime('%Y-%m-%d')}.png"
    if png.exists():  # a plot bench/README links to: a second run the same day adds its own
        png = RESULTS / f"held-xact-{time.strftime('%Y-%m-%d-%H%M%S')}.png"
    plot(rows, summary, png)
    return table(
        f"sustained load on postgresql with a held transaction: {summary}; one subscriber "
        f"process on the defaults, no-op handler (plot: {png.relative_to(png.parents[2])})",
        ["window", "held", "msg/s", "p50 ms", "p99 ms", "dead tuples", "table MB",
         "autovacuums", "versions/msg", "HOT share"],
        [[r["window"], "yes" if r["held"] else "", r["msg/s"], r["p50"], r["p99"], r["dead"],
          f"{r['MB']:.1f}", r["autovacuums"], f"{r['versions/msg']:.2f}",
          f"{100 * r['hot']:.0f}%"] for r in rows])


# ---- relay and inbox ----------------------------------------------------------------------

def run_relay(args: argparse.Namespace) -> str:
    from .relay import run_relay as relay

    return relay(args)


def run_inbox(args: argparse.Namespace) -> str:
    from .inbox import run_inbox as inbox

    return inbox(args)


def run_peers(args: argparse.Namespace) -> str:
    from .peers import CONTENDERS
    from .peers import run_peers as peers

    chosen = args.contenders.split(",") if args.contenders else list(CONTENDERS)
    unknown = sorted(set(chosen) - set(CONTENDERS))
    if unknown:
        raise SystemExit(f"unknown --contenders {', '.join(unknown)}: choose from "
                         f"{', '.join(CONTENDERS)}")
    return peers(args.n, args.repeat, chosen, args.waldump, _log)


# ---- main ----------------------------------------------------------------------------------

def _sync(fn: Any, *args: Any) -> Any:
    return asyncio.run(fn(*args))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _log(line: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def conditions() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (f"machine: {platform.node()} {os.cpu_count()} CPUs, python "
            f"{platform.python_version()}, load average at the end "
            f"{', '.join(f'{x:.1f}' for x in load)}; databases on the same host")


def standalone_args(doc: str, count: str, default: int) -> argparse.Namespace:
    """The options of a bench module run by itself: ``--db``, its count (``--{count}``) and
    ``--rounds``; its docstring's first paragraph as the description."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--db", default="all", choices=[*DATABASES, "all"])
    p.add_argument(f"--{count}", type=int, default=default)
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


def standalone_footer(module: str, args: argparse.Namespace, count: str) -> str:
    """What follows a standalone module's table: the machine, and the command that
    reproduces it (options from :func:`standalone_args`)."""
    return (f"\n{conditions()}\nreproduce: .venv/bin/python -m bench.{module} --db {args.db} "
            f"--{count} {getattr(args, count)} --rounds {args.rounds}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    what = ["drain", "publish", "latency"] if args.what == "all" else [args.what]
    for name in what:  # each table as soon as it is done
        print({"drain": run_drain, "publish": run_publish, "latency": run_latency,
               "fresh": run_fresh, "workers": run_workers,
               "processes": run_processes, "held": run_held,
               "channels": run_channels, "relay": run_relay,
               "inbox": run_inbox, "peers": run_peers}[name](args) + "\n", flush=True)
    print(f"\n{conditions()}")
    print(f"reproduce: .venv/bin/python -m bench.run {shlex.join(argv)}")


if __name__ == "__main__":
    main()
