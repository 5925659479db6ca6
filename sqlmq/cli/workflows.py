"""``sqlmq workflows``: list workflows, show one step by step, cancel one; ``sqlmq signal``:
send a signal to a message that waits for it (see :mod:`sqlmq.workflows`)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..broker import Broker
from ..workflows.records import StepStatus
from .common import EXIT_FAILED, PositiveInt, UsageError, database, json_option, print_json


@click.group("workflows")
def workflows() -> None:
    """List workflows, show one step by step, cancel one."""


@workflows.command("list")
@click.option("--limit", type=PositiveInt(), default=50, show_default=True)
@json_option
@database
async def workflows_list(broker: Broker, limit: int, as_json: bool) -> int:
    """The newest workflows: steps, how many ended and how many of those completed."""
    await broker.check_schema()
    found = await broker.workflows(limit)
    if as_json:
        print_json([{"name": w.name, "steps": w.steps, "ended": w.ended,
                     "completed": w.completed, "created_at": w.created_at.isoformat()}
                    for w in found])
        return 0
    print("\t".join(("workflow", "steps", "ended", "completed", "created")))
    for w in found:
        print("\t".join((w.name, str(w.steps), str(w.ended), str(w.completed),
                         w.created_at.isoformat(timespec="seconds"))))
    return 0


def _step_json(s: StepStatus) -> dict[str, object]:
    return {"name": s.name, "id": s.id, "queue": s.queue, "state": s.state, "after": s.after,
            "attempts": s.attempts, "error": s.error, "on_failure": s.on_failure}


@workflows.command("show")
@click.argument("name")
@json_option
@database
async def workflows_show(broker: Broker, name: str, as_json: bool) -> int:
    """Each step of a workflow: its message, queue, state, what it waits for, its error."""
    await broker.check_schema()
    status = await broker.workflow_status(name)
    if as_json:
        print_json({"name": name, "state": status.state,
                    "steps": [_step_json(s) for s in status.steps]})
        return 0
    print(f"workflow {name}: {status.state}")
    print("\t".join(("step", "id", "queue", "state", "after", "attempts", "error")))
    for s in status.steps:
        error = (s.error or "").split("\n", 1)[0][:120]
        print("\t".join((s.name, str(s.id), s.queue, s.state, ",".join(s.after) or "-",
                         str(s.attempts), error)))
    return 0


@workflows.command("cancel")
@click.argument("name")
@database
async def workflows_cancel(broker: Broker, name: str) -> int:
    """Cancel every step that has not ended: waiting and ready ones at once, running ones
    asked to stop."""
    await broker.check_schema()
    done = await broker.cancel_workflow(name)
    for step, c in done.items():
        print(f"{step}\tmessage {c.id}\t{c.outcome}")
    print(f"workflow {name}: {len(done)} step(s) cancelled or asked to stop")
    return 0


@click.command("signal")
@click.argument("msg_id", type=int)
@click.argument("name")
@click.option("--payload", help="a JSON value (default: none)")
@database
async def signal(broker: Broker, msg_id: int, name: str, payload: str | None) -> int:
    """Send signal NAME to message MSG_ID: a message waiting for it (msg.wait_for) runs at
    once, one that waits for it later takes it then. Exit 1 if the message ended or does
    not exist."""
    value: Any = None
    if payload is not None:
        try:
            value = json.loads(payload)
        except ValueError as exc:
            raise UsageError(f"--payload is not JSON: {exc}") from None
    await broker.check_schema()
    if not await broker.signal(msg_id, name, value):
        print(f"sqlmq: error: message {msg_id} ended or does not exist: signal {name!r} was "
              f"not kept", file=sys.stderr)
        return EXIT_FAILED
    print(f"signal {name!r} sent to message {msg_id}")
    return 0
