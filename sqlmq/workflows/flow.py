"""Building a workflow: steps added one by one, each naming the steps it waits for, then
published in one transaction (the caller's with ``connection=``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, PublishError
from ..publishing import check_executor, prepare
from ..subscriber import check_name
from .records import STEP_HEADER, WORKFLOW_HEADER, OnFailure, StepSpec

if TYPE_CHECKING:
    from ..engines.contract import Engine
    from ..publisher import AsyncTransaction, Expiry, SyncTransaction
    from ..wakeups import Wakeups


def checked_name(name: str, what: str) -> str:
    """``name`` if it keeps a queue name's rules (the column's), else a
    :class:`~sqlmq.errors.PublishError` naming ``what`` and why."""
    try:
        return check_name(name, what)
    except ConfigurationError as exc:
        raise PublishError(str(exc)) from None


class Step:
    """A step added to a :class:`Workflow`: what a later step's ``after=`` names."""

    __slots__ = ("_flow", "index", "name")

    def __init__(self, flow: Workflow, index: int, name: str) -> None:
        self._flow = flow
        self.index = index
        self.name = name

    def __repr__(self) -> str:
        return f"Step({self._flow.name!r}, {self.name!r})"


class Workflow:
    """Messages that wait for other messages. ``add`` a step per message, each ``after``
    the steps it waits for; ``publish`` writes them all in one transaction. A step waits
    (not acquirable, not counted as ready) until every step it names has ended; the settle
    that ends the last one publishes it, in the same transaction. See docs/workflows.md."""

    def __init__(self, name: str, engine: Engine, wakeups: Wakeups,
                 max_payload_bytes: int) -> None:
        self.name = checked_name(name, "workflow name")
        self._engine = engine
        self._wakeups = wakeups
        self._max_payload_bytes = max_payload_bytes
        self._steps: list[StepSpec] = []
        self._names: set[str] = set()
        self._published = False

    def add(self, queue: str, body: Any, *, after: Iterable[Step] = (), name: str | None = None,
            on_failure: OnFailure | str = OnFailure.CANCEL,
            headers: Mapping[str, str] | None = None, delay: float | timedelta | None = None,
            at: datetime | None = None, priority: int = 0, expires: Expiry | None = None,
            channel: str | None = None) -> Step:
        """Add a step: a message to ``queue``, published once every step in ``after`` has
        ended (at once without any). ``name`` (default: the queue's, with ``-2``, ``-3``…
        if taken) is how its dependents' handlers and the status name it. ``delay`` and
        ``at`` count from its release; ``expires`` from this publish."""
        if self._published:
            raise PublishError(f"workflow {self.name!r} was published already")
        after = list(after)
        for s in after:
            if not isinstance(s, Step) or s._flow is not self:
                raise PublishError(f"after= takes steps added to workflow {self.name!r}, "
                                   f"got {s!r}")
        try:
            failure = OnFailure(on_failure)
        except ValueError:
            raise PublishError(f"on_failure must be 'cancel' or 'run', got {on_failure!r}"
                               ) from None
        step_name = self._name_for(queue if name is None else name)
        own = {**(headers or {}), WORKFLOW_HEADER: self.name, STEP_HEADER: step_name}
        message = prepare(queue, [body], headers=own, delay=delay, at=at,
                          max_payload_bytes=self._max_payload_bytes, priority=priority,
                          expires=expires, channel=channel)
        self._steps.append(StepSpec(step_name, message, sorted({s.index for s in after}),
                                    failure))
        self._names.add(step_name)
        return Step(self, len(self._steps) - 1, step_name)

    def _name_for(self, wanted: str) -> str:
        name, n = checked_name(wanted, "step name"), 1
        while name in self._names:
            n += 1
            name = f"{wanted}-{n}"
        return name

    def _ready(self) -> list[StepSpec]:
        if not self._steps:
            raise PublishError(f"workflow {self.name!r} has no steps")
        if self._published:
            raise PublishError(f"workflow {self.name!r} was published already")
        return self._steps

    async def publish(self, *, connection: AsyncTransaction | None = None) -> dict[str, int]:
        """Write every step in one transaction (``connection``'s, if given: the outbox);
        returns each step's message id, by step name."""
        steps = self._ready()
        executor = check_executor(connection, asynchronous=True)
        ids = await self._engine.publish_workflow(self.name, steps, executor)
        self._published = True
        self._wake(connection)
        return {s.name: i for s, i in zip(steps, ids, strict=True)}

    def publish_sync(self, *, connection: SyncTransaction | None = None) -> dict[str, int]:
        """The same, for code without an event loop."""
        steps = self._ready()
        executor = check_executor(connection, asynchronous=False)
        ids = self._engine.publish_workflow_sync(self.name, steps, executor)
        self._published = True
        self._wake(connection)
        return {s.name: i for s, i in zip(steps, ids, strict=True)}

    def _wake(self, connection: Any) -> None:
        for queue in {s.message.queue for s in self._steps if not s.after}:
            self._wakeups.wake_when_visible(queue, connection)


__all__ = ["Step", "Workflow", "checked_name"]
