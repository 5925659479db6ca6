"""``sqlmq channels``: list channels, set or reset their limits, and the queues' defaults
(see :mod:`sqlmq.channels`). Kept apart from :mod:`sqlmq.cli`, which dispatches here."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from .broker import Broker
from .channels import ChannelSettings


def add_parser(sub: Any, url_arg: Callable[[argparse.ArgumentParser], None],
               positive_int: Callable[[str], int]) -> None:
    channels = sub.add_parser("channels", help="list channels, set or reset their limits")
    csub = channels.add_subparsers(dest="channels_command", required=True)
    p = csub.add_parser("list", help="each channel's limits, waiting and running messages")
    url_arg(p)
    p.add_argument("--json", action="store_true")
    for name, helptext in (("set", "give a channel its own limits"),
                           ("default", "the limits of a queue's channels without their own")):
        p = csub.add_parser(name, help=helptext)
        url_arg(p)
        p.add_argument("name" if name == "set" else "queue")
        p.add_argument("--max-concurrency", type=positive_int, default=None)
        p.add_argument("--rate", type=float, default=None, help="starts per second")
        p.add_argument("--ordered", action="store_true", help="strict FIFO")
        p.add_argument("--max-size", type=positive_int, default=None)
        if name == "set":
            p.add_argument("--queue", help="its queue, if the channel is new")
        else:
            p.add_argument("--reset", action="store_true", help="remove the queue's default")
    p = csub.add_parser("reset", help="a channel takes its queue's default again")
    url_arg(p)
    p.add_argument("name")


def _limits(s: ChannelSettings) -> dict[str, Any]:
    return {"max_concurrency": s.max_concurrency, "rate": s.rate, "ordered": s.ordered,
            "max_size": s.max_size}


def _describe(s: ChannelSettings) -> str:
    parts = [f"{k}={v}" for k, v in _limits(s).items() if v not in (None, False)]
    return " ".join(parts) or "no limits"


async def run(broker: Broker, args: argparse.Namespace) -> int:
    await broker.check_schema()
    command = args.channels_command
    if command == "set":
        settings = ChannelSettings(args.max_concurrency, args.rate, args.ordered,
                                   args.max_size)
        await broker.set_channel(args.name, queue=args.queue, **_limits(settings))
        print(f"channel {args.name!r}: {_describe(settings)}")
        return 0
    if command == "reset":
        await broker.reset_channel(args.name)
        print(f"channel {args.name!r} takes its queue's default again")
        return 0
    if command == "default":
        if args.reset:
            await broker.reset_channel_default(args.queue)
            print(f"queue {args.queue!r} has no channel default")
            return 0
        await broker.set_channel_default(args.queue, max_concurrency=args.max_concurrency,
                                         rate=args.rate, ordered=args.ordered,
                                         max_size=args.max_size)
        print(f"channels of queue {args.queue!r} without limits of their own: "
              f"{_describe((await broker.channel_defaults())[args.queue])}")
        return 0
    found = await broker.channels()
    rows = [{"name": c.name, "queue": c.queue, "own": c.settings is not None,
             **_limits(c.effective), "waiting": c.waiting, "running": c.running,
             "last_served_at": c.last_served_at and c.last_served_at.isoformat()}
            for c in found]
    if args.json:
        print(json.dumps(rows))
        return 0
    print("\t".join(("channel", "queue", "limits", "waiting", "running", "last served")))
    for c in found:
        own = "" if c.settings is not None else " (queue default)"
        served = c.last_served_at.isoformat(timespec="seconds") if c.last_served_at else ""
        print("\t".join((c.name, c.queue, _describe(c.effective) + own, str(c.waiting),
                         str(c.running), served)))
    return 0


__all__ = ["add_parser", "run"]
