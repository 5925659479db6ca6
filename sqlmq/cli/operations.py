"""``sqlmq pause``, ``resume`` and ``workers``: steering queues across every process, and
seeing who consumes them (see :mod:`sqlmq.operations`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click

from ..broker import Broker
from ..records import WorkerInfo
from .common import database, json_option, print_json, print_table


@click.command("pause")
@click.argument("queue")
@database
async def pause(broker: Broker, queue: str) -> int:
    """Stop every process and host from taking QUEUE's messages until `sqlmq resume`
    (publishing goes on; the messages wait)."""
    await broker.check_schema()
    newly = await broker.pause(queue)  # checks the name
    print(f"paused {queue}" if newly else f"{queue} was paused already")
    return 0


@click.command("resume")
@click.argument("queue")
@database
async def resume(broker: Broker, queue: str) -> int:
    """Let QUEUE's messages be taken again."""
    await broker.check_schema()
    lifted = await broker.resume(queue)  # checks the name
    print(f"resumed {queue}" if lifted else f"{queue} was not paused")
    return 0


@click.command("workers")
@json_option
@database
async def workers(broker: Broker, as_json: bool) -> int:
    """The live workers: every running broker on these tables, from its last heartbeat
    (host, pid, version, subscribers, handlers running, deliveries held), and the paused
    queues."""
    await broker.check_schema()
    found, paused = await broker.workers(), await broker.paused()
    if as_json:
        print_json({"workers": [_worker_json(w) for w in found],
                    "paused": [{"queue": p.queue, "paused_at": p.paused_at.isoformat()}
                               for p in paused]})
        return 0
    print_table("live workers", ["host", "pid", "version", "started", "heartbeat",
                                 "subscribers", "running", "held"],
                [[w.host, str(w.pid), w.version, w.started_at.isoformat(timespec="seconds"),
                  w.heartbeat_at.isoformat(timespec="seconds"),
                  " ".join(f"{s['handler']}({','.join(s['queues'])}×{s['workers']})"
                           for s in w.subscribers), str(w.running), str(w.held)]
                 for w in found])
    if paused:
        print("paused: " + ", ".join(p.queue for p in paused))
    return 0


def _worker_json(w: WorkerInfo) -> dict[str, Any]:
    out = asdict(w)
    for key in ("started_at", "heartbeat_at", "expires_at"):
        out[key] = out[key].isoformat()
    return out


__all__ = ["pause", "resume", "workers"]
