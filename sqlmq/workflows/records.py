"""What crosses the engine contract for workflows: the steps a publish writes, and what a
status, a list or a step's dependencies read back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from ..codec import decode_state
from ..lifecycle import State
from ..new_messages import NewMessages

#: The headers every step's message carries: its workflow's name and its own. The runtime
#: reads the first to know that a settle of the message releases or cancels other steps.
#: (:mod:`sqlmq.message` spells them too: this module is beyond its imports.)
WORKFLOW_HEADER = "sqlmq-workflow"
STEP_HEADER = "sqlmq-step"

#: The states in which a step has ended (its message is archived).
ENDED = frozenset({State.COMPLETED.value, State.FAILED.value, State.EXPIRED.value,
                   State.CANCELLED.value})


class OnFailure(StrEnum):
    """What a step does when one of its dependencies ends FAILED, CANCELLED or EXPIRED.

    ``CANCEL`` (default): it is cancelled (archived CANCELLED, the reason naming the
    dependency), and so are the steps that wait on it, transitively. ``RUN``: it runs
    once its dependencies have all ended, whatever their ending, and reads them in
    ``msg.dependencies()``."""

    CANCEL = "cancel"
    RUN = "run"


@dataclass(slots=True)
class StepSpec:
    """One step of a workflow's publish: its message (one, validated and encoded), the
    steps it waits for (indexes of steps before it in the same publish) and what a failed
    dependency does to it."""

    name: str
    message: NewMessages
    after: list[int] = field(default_factory=list)
    on_failure: OnFailure = OnFailure.CANCEL


@dataclass(frozen=True, slots=True)
class StepStatus:
    """One step as ``Broker.workflow_status`` reads it. ``state``: WAITING until its
    dependencies end, then its message's (PENDING, PROCESSING, RETRYABLE, and once it
    ended COMPLETED, FAILED, EXPIRED or CANCELLED); UNKNOWN if the archive row was purged."""

    name: str
    id: int
    queue: str
    state: str
    after: list[str]
    attempts: int = 0
    error: str | None = None
    on_failure: str = OnFailure.CANCEL.value
    stored_result: bytes | None = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def result(self) -> Any:
        """What its handler returned (None if it kept nothing)."""
        return None if self.stored_result is None else decode_state(self.stored_result)


@dataclass(frozen=True, slots=True)
class WorkflowStatus:
    """A workflow's steps, in the order they were added."""

    name: str
    steps: list[StepStatus]

    def step(self, name: str) -> StepStatus:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"workflow {self.name!r} has no step {name!r}")

    @property
    def ended(self) -> bool:
        """Whether every step has ended."""
        return all(s.ended for s in self.steps)

    @property
    def state(self) -> str:
        """COMPLETED when every step completed; FAILED when every step ended and one did
        not complete; RUNNING otherwise."""
        if not self.ended:
            return "RUNNING"
        return ("COMPLETED" if all(s.state == State.COMPLETED for s in self.steps)
                else "FAILED")


@dataclass(frozen=True, slots=True)
class WorkflowSummary:
    """A workflow in ``Broker.workflows()``: how many steps it has, how many ended and how
    many of those completed, and when it was published."""

    name: str
    steps: int
    ended: int
    completed: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Dependency:
    """A dependency of a step, as its handler reads it in ``msg.dependencies()``."""

    name: str
    id: int
    state: str
    error: str | None = None
    stored_result: bytes | None = None

    @property
    def ok(self) -> bool:
        return self.state == State.COMPLETED

    @property
    def result(self) -> Any:
        """What its handler returned (None if it kept nothing)."""
        return None if self.stored_result is None else decode_state(self.stored_result)


@dataclass(frozen=True, slots=True)
class Signal:
    """What a message that waited (``msg.wait_for``) reads on its next delivery with
    ``await msg.signal()``: the signal that came (``payload``, ``sent_at``), or, with
    ``timed_out``, none before its timeout."""

    name: str
    stored_payload: bytes | None = None
    sent_at: datetime | None = None

    @property
    def timed_out(self) -> bool:
        return self.sent_at is None

    @property
    def payload(self) -> Any:
        """What ``Broker.signal`` sent (None: nothing, or a timeout)."""
        return None if self.stored_payload is None else decode_state(self.stored_payload)


__all__ = ["ENDED", "STEP_HEADER", "WORKFLOW_HEADER", "Dependency", "OnFailure", "Signal",
           "StepSpec", "StepStatus", "WorkflowStatus", "WorkflowSummary"]
