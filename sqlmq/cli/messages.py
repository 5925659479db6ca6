"""``sqlmq publish``, ``show``, ``cancel``, ``queues`` and ``inspect``: messages and queues,
read through :mod:`sqlmq.insights`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import click

from ..broker import Broker
from ..errors import SqlmqError
from ..insights import QueueOverview
from ..views import MessageView
from .common import (
    EXIT_FAILED,
    PositiveInt,
    UsageError,
    ago,
    database,
    json_option,
    print_json,
    print_table,
)


@click.command("publish")
@click.argument("queue")
@click.argument("body")
@click.option("--topic", is_flag=True,
              help="publish to the topic QUEUE: a copy per consumer group it reaches")
@click.option("--text", is_flag=True, help="send the body as text/plain, not JSON")
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE")
@click.option("--delay", type=click.FloatRange(min=0), default=None, help="seconds")
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--batch-size", type=PositiveInt(), default=500, show_default=True,
              help="messages per transaction when BODY is - (one per line on stdin)")
@database
async def publish(broker: Broker, queue: str, body: str, topic: bool, text: bool,
                  headers: tuple[str, ...], delay: float | None, priority: int,
                  batch_size: int) -> int:
    """Publish BODY to QUEUE: JSON (or text with --text), @FILE for a file's content, or -
    for many messages, one JSON value (or text line) per line of stdin, in batches.

    Prints the id of each message published (with --topic: the ids per group queue)."""
    parsed = _headers(headers)
    if body == "-":
        if topic:
            raise UsageError("publish --topic takes one BODY, not - (stdin)")
        await broker.check_schema()
        return await _publish_lines(broker, queue, sys.stdin, text, parsed, delay, priority,
                                    batch_size)
    if body.startswith("@"):
        body = _read_file(body[1:])
    value = body if text else _json_body(body)
    await broker.check_schema()
    if topic:
        fanout = await broker.publish_topic(queue, value, headers=parsed, delay=delay,
                                            priority=priority)
        print(json.dumps(fanout))  # {group queue: id}; {} when no group matched
        return 0
    print(await broker.publish(queue, value, headers=parsed, delay=delay, priority=priority))
    return 0


async def _publish_lines(broker: Broker, queue: str, lines: TextIO, text: bool,
                         headers: dict[str, str], delay: float | None, priority: int,
                         batch_size: int) -> int:
    """Publish stdin batch by batch: a batch is checked whole before its transaction, so a
    bad line stops the run with every earlier line published and none after it."""
    published = [0]
    for batch in _batches(lines, text, batch_size, published):
        ids = await broker.publish_batch(queue, batch, headers=headers, delay=delay,
                                         priority=priority)
        published[0] += len(ids)
        print("\n".join(map(str, ids)))
    print(f"published {published[0]} message(s) to {queue!r}", file=sys.stderr)
    return 0


def _batches(lines: TextIO, text: bool, size: int,
             published: list[int]) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        try:
            batch.append(line if text else json.loads(line))
        except ValueError as exc:
            raise UsageError(f"line {number} of stdin is not valid JSON ({exc}); "
                             f"{published[0]} message(s) published before its batch, none "
                             "after (pass --text for text lines)") from None
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"cannot read the body from {path!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path!r} is not UTF-8 text") from None


def _json_body(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"the body is not valid JSON ({exc}); pass --text to publish it as "
                         "text") from None


def _headers(items: tuple[str, ...]) -> dict[str, str]:
    headers = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--header takes KEY=VALUE, got {item!r}")
        headers[key] = value
    return headers


@click.command("show")
@click.argument("msg_id", metavar="ID", type=int)
@json_option
@database
async def show(broker: Broker, msg_id: int, as_json: bool) -> int:
    """A message by id, waiting, running or archived: payload, headers, result, history."""
    await broker.check_schema()
    view = await broker.insights().message(msg_id)
    if view is None:
        raise SqlmqError(f"no message {msg_id} (not waiting, running or archived)")
    print_message(view, as_json)
    return 0


def print_message(view: MessageView, as_json: bool) -> None:
    data = view.to_json()
    if as_json:
        print_json(data)
        return
    fields = ("id", "queue", "state", "channel", "priority", "attempts", "deliveries",
              "created_at", "next_attempt_at", "lease_expires_at", "archived_at")
    for name in fields:
        if data[name] is not None:
            print(f"{name}: {data[name]}")
    if view.error:
        print(f"error: {view.error}")
    print(f"headers: {json.dumps(view.headers, sort_keys=True)}")
    if "payload" in data:
        payload = data["payload"]
        print("payload:", json.dumps(payload, indent=2) if not isinstance(payload, str)
              else payload)
    else:
        print(f"payload ({len(view.payload)} bytes, hex): {view.payload.hex(' ')}")
    _print_result(view, data)
    print("history:")
    for entry in view.history:
        print(f"  {json.dumps(entry, sort_keys=True)}")


def _print_result(view: MessageView, data: dict[str, Any]) -> None:
    """The result its subscriber kept (``results=True``), if any, as the payload is shown."""
    parts = view.result_parts()
    if parts is None:
        return
    if "result" in data:
        value = data["result"]
        print("result:", value if isinstance(value, str) else json.dumps(value, indent=2))
    else:
        print(f"result ({len(parts[1])} bytes, hex): {parts[1].hex(' ')}")


@click.command("cancel")
@click.argument("ids", metavar="ID...", nargs=-1, required=True, type=int)
@json_option
@database
async def cancel(broker: Broker, ids: tuple[int, ...], as_json: bool) -> int:
    """Cancel messages: archive waiting ones CANCELLED, flag running ones (their handler
    sees msg.cancel_requested). An id that names no message is an error on stderr, and the
    command exits 1 after cancelling the others (--json lists every id, those too)."""
    await broker.check_schema()
    found = [await broker.cancel(i) for i in ids]
    if as_json:
        print_json([{"id": c.id, "outcome": c.outcome, "state": c.state} for c in found])
    for c in found:
        if c.outcome == "unknown":
            print(f"sqlmq: error: {c}", file=sys.stderr)
        elif not as_json:
            print(c)
    return EXIT_FAILED if any(c.outcome == "unknown" for c in found) else 0


_COUNT_COLUMNS = ("pending", "processing", "retryable", "completed", "failed", "expired",
                  "cancelled")


@click.command("queues")
@json_option
@database
async def queues(broker: Broker, as_json: bool) -> int:
    """Per queue: messages by state, the oldest ready message's wait, completions per
    minute over the last minute and hour, and end-to-end latency (last hour)."""
    await broker.check_schema()
    found = await broker.insights().queues()
    if as_json:
        print_json([overview_json(q) for q in found])
        return 0
    columns = ("queue", *_COUNT_COLUMNS, "oldest ready", "waiting", "done/min (1m)",
               "done/min (1h)", "p50 s", "p99 s")
    print_table(f"sqlmq queues in {broker.url}", columns, [
        (q.queue, *(str(getattr(q.stats, c)) for c in _COUNT_COLUMNS),
         q.stats.oldest_ready_at.isoformat(timespec="seconds") if q.stats.oldest_ready_at
         else "", ago(q.oldest_ready_age),
         f"{q.rate('1m') * 60:.1f}", f"{q.rate('1h') * 60:.1f}",
         f"{q.latency.p50:.3f}" if q.latency else "", f"{q.latency.p99:.3f}" if q.latency
         else "") for q in found])
    return 0


def overview_json(q: QueueOverview) -> dict[str, Any]:
    return {
        "queue": q.queue, **{c: getattr(q.stats, c) for c in _COUNT_COLUMNS},
        "oldest_ready_at": q.stats.oldest_ready_at and q.stats.oldest_ready_at.isoformat(),
        "oldest_ready_age": q.oldest_ready_age,
        "activity": {name: {"completed": w.completed, "failed": w.failed,
                            "cancelled": w.cancelled, "expired": w.expired,
                            "retried": w.retried} for name, w in q.activity.items()},
        "latency": None if q.latency is None else {
            "count": q.latency.count, "p50": q.latency.p50, "p90": q.latency.p90,
            "p99": q.latency.p99, "max": q.latency.max},
    }


@click.command("inspect")
@click.argument("queue")
@json_option
@database
async def inspect(broker: Broker, queue: str, as_json: bool) -> int:
    """One queue in detail: counts, rates, latency, live messages by delivery count, its
    channels and schedules."""
    await broker.check_schema()
    detail = await broker.insights().queue(queue)
    if detail is None:
        known = ", ".join(repr(q.queue) for q in await broker.stats()) or "none"
        raise SqlmqError(f"no queue named {queue!r} has messages, live or archived "
                         f"(queues: {known})")
    data = overview_json(detail.overview) | {
        "deliveries": {str(n): c for n, c in sorted(detail.deliveries.items())},
        "channels": [{"name": c.name, "waiting": c.waiting, "running": c.running}
                     for c in detail.channels],
        "schedules": [{"name": s.name, "cadence": s.cadence.describe()}
                      for s in detail.schedules]}
    if as_json:
        print_json(data)
        return 0
    print(f"queue: {queue}")
    print("messages: " + ", ".join(f"{c} {data[c]}" for c in _COUNT_COLUMNS))
    if detail.overview.oldest_ready_age is not None:
        print(f"oldest ready message waiting: {ago(detail.overview.oldest_ready_age)}")
    for name, w in data["activity"].items():
        print(f"last {name}: " + ", ".join(f"{k} {v}" for k, v in w.items()))
    lat = detail.overview.latency
    if lat is not None:
        print(f"latency (created -> archived, last 1h, {lat.count} messages): "
              f"p50 {lat.p50:.3f}s p90 {lat.p90:.3f}s p99 {lat.p99:.3f}s max {lat.max:.3f}s")
    print("live messages by deliveries: " + (", ".join(
        f"{n}: {c}" for n, c in data["deliveries"].items()) or "none"))
    for c in data["channels"]:
        print(f"channel {c['name']}: {c['waiting']} waiting, {c['running']} running")
    for s in data["schedules"]:
        print(f"schedule {s['name']}: {s['cadence']}")
    return 0


__all__ = ["cancel", "inspect", "overview_json", "print_message", "publish", "queues", "show"]
