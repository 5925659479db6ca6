"""``sqlmq groups``, ``channels`` and ``schedules``: what routes, paces and times messages
(see :mod:`sqlmq.topics`, :mod:`sqlmq.channels`, :mod:`sqlmq.schedules`)."""

from __future__ import annotations

from typing import Any

import click

from ..broker import Broker
from ..channels import ChannelSettings
from ..errors import SqlmqError
from .common import PositiveInt, UsageError, database, json_option, print_json


@click.group("groups")
def groups() -> None:
    """List or delete the consumer groups of topics."""


@groups.command("list")
@json_option
@database
async def groups_list(broker: Broker, as_json: bool) -> int:
    """Every consumer group: its topic pattern, name, queue and creation time."""
    await broker.check_schema()
    found = await broker.groups()
    if as_json:
        print_json([{"pattern": g.pattern, "group": g.group, "queue": g.queue,
                     "created_at": g.created_at.isoformat()} for g in found])
        return 0
    for g in found:  # pattern, group, queue, created
        print(f"{g.pattern}\t{g.group}\t{g.queue}\t{g.created_at.isoformat(timespec='seconds')}")
    return 0


@groups.command("delete")
@click.argument("pattern")
@click.argument("group")
@database
async def groups_delete(broker: Broker, pattern: str, group: str) -> int:
    """Delete a group and the copies waiting or running in its queue."""
    await broker.check_schema()
    removed = await broker.delete_group(pattern, group)
    print(f"deleted group {group!r} of {pattern!r} and {removed} message(s) in its queue")
    return 0


@click.group("channels")
def channels() -> None:
    """List channels, set or reset their limits and the queues' defaults."""


def _limit_options(fn: Any) -> Any:
    for option in reversed((
        click.option("--max-concurrency", type=PositiveInt(), default=None),
        click.option("--rate", type=float, default=None, help="starts per second"),
        click.option("--ordered", is_flag=True, help="strict FIFO"),
        click.option("--max-size", type=PositiveInt(), default=None),
    )):
        fn = option(fn)
    return fn


def _limits(s: ChannelSettings) -> dict[str, Any]:
    return {"max_concurrency": s.max_concurrency, "rate": s.rate, "ordered": s.ordered,
            "max_size": s.max_size}


def _describe(s: ChannelSettings) -> str:
    parts = [f"{k}={v}" for k, v in _limits(s).items() if v not in (None, False)]
    return " ".join(parts) or "no limits"


@channels.command("list")
@json_option
@database
async def channels_list(broker: Broker, as_json: bool) -> int:
    """Each channel's limits, waiting and running messages."""
    await broker.check_schema()
    found = await broker.channels()
    if as_json:
        print_json([{"name": c.name, "queue": c.queue, "own": c.settings is not None,
                     **_limits(c.effective), "waiting": c.waiting, "running": c.running,
                     "last_served_at": c.last_served_at and c.last_served_at.isoformat()}
                    for c in found])
        return 0
    print("\t".join(("channel", "queue", "limits", "waiting", "running", "last served")))
    for c in found:
        own = "" if c.settings is not None else " (queue default)"
        served = c.last_served_at.isoformat(timespec="seconds") if c.last_served_at else ""
        print("\t".join((c.name, c.queue, _describe(c.effective) + own, str(c.waiting),
                         str(c.running), served)))
    return 0


@channels.command("set")
@click.argument("name")
@_limit_options
@click.option("--queue", help="its queue, if the channel is new")
@database
async def channels_set(broker: Broker, name: str, max_concurrency: int | None,
                       rate: float | None, ordered: bool, max_size: int | None,
                       queue: str | None) -> int:
    """Give a channel its own limits, for every process at once."""
    await broker.check_schema()
    settings = ChannelSettings(max_concurrency, rate, ordered, max_size)
    await broker.set_channel(name, queue=queue, **_limits(settings))
    print(f"channel {name!r}: {_describe(settings)}")
    return 0


@channels.command("default")
@click.argument("queue")
@_limit_options
@click.option("--reset", is_flag=True, help="remove the queue's default")
@database
async def channels_default(broker: Broker, queue: str, max_concurrency: int | None,
                           rate: float | None, ordered: bool, max_size: int | None,
                           reset: bool) -> int:
    """The limits of a queue's channels without their own."""
    await broker.check_schema()
    if reset:
        await broker.reset_channel_default(queue)
        print(f"queue {queue!r} has no channel default")
        return 0
    await broker.set_channel_default(queue, max_concurrency=max_concurrency, rate=rate,
                                     ordered=ordered, max_size=max_size)
    print(f"channels of queue {queue!r} without limits of their own: "
          f"{_describe((await broker.channel_defaults())[queue])}")
    return 0


@channels.command("reset")
@click.argument("name")
@database
async def channels_reset(broker: Broker, name: str) -> int:
    """A channel takes its queue's default again."""
    await broker.check_schema()
    await broker.reset_channel(name)
    print(f"channel {name!r} takes its queue's default again")
    return 0


@click.command("schedules")
@click.option("--pause", metavar="NAME", help="pause the schedule NAME: no tick until resumed")
@click.option("--resume", metavar="NAME", help="let the paused schedule NAME tick again")
@click.option("--delete", metavar="NAME", help="forget the schedule NAME and its ticks")
@json_option
@database
async def schedules(broker: Broker, pause: str | None, resume: str | None,
                    delete: str | None, as_json: bool) -> int:
    """Periodic schedules: last and next tick; or --pause, --resume or --delete one."""
    await broker.check_schema()
    if sum(name is not None for name in (pause, resume, delete)) > 1:
        raise UsageError("give one of --pause, --resume and --delete")
    if pause is not None:
        done = await broker.pause_schedule(pause)
        print(f"paused schedule {pause!r}: no process publishes its ticks until it is resumed"
              if done else f"schedule {pause!r} was paused already")
        return 0
    if resume is not None:
        done = await broker.resume_schedule(resume)
        print(f"resumed schedule {resume!r}; its catch_up decides what it missed"
              if done else f"schedule {resume!r} was not paused")
        return 0
    if delete is not None:
        if not await broker.delete_schedule(delete):
            known = ", ".join(repr(s.name) for s in await broker.schedules()) or "none"
            raise SqlmqError(f"no schedule named {delete!r} (schedules: {known})")
        print(f"deleted schedule {delete!r}; a process still running it makes it again")
        return 0
    now = await broker.engine.now()
    found = [{"name": s.name, "queue": s.queue, "cadence": s.cadence.describe(),
              "catch_up": s.catch_up,
              "last_tick": s.last_tick_at and s.last_tick_at.isoformat(),
              "last_message_id": s.last_message_id,
              "next_tick": None if s.paused else s.next_tick(now).isoformat(),
              "paused_at": s.paused_at and s.paused_at.isoformat()}
             for s in await broker.schedules()]
    if as_json:
        print_json(found)
        return 0
    print("\t".join(("name", "queue", "cadence", "catch_up", "last tick", "message",
                     "next tick")))
    for r in found:
        paused = r.pop("paused_at")
        if paused is not None:
            r["next_tick"] = f"paused since {paused}"
        print("\t".join("" if v is None else str(v) for v in r.values()))
    return 0


__all__ = ["channels", "groups", "schedules"]
