"""The workflows half of the engine contract (:class:`~.contract.Engine` includes it): the
publish of a workflow's steps and what its status reads (see :mod:`sqlmq.workflows`). The
release and cancellation of waiting steps is ``settle``'s and ``cancel``'s business, in
their transactions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from ...workflows.records import Dependency, Signal, StepSpec, StepStatus, WorkflowSummary

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session


class WorkflowsContract(Protocol):
    """What ``Broker.workflow`` and its status need of an engine."""

    async def publish_workflow(
        self, workflow: str, steps: Sequence[StepSpec],
        executor: AsyncConnection | AsyncSession | Any | None = None,
    ) -> list[int]:
        """Write ``steps`` in one transaction (``executor``'s, else one of the engine's):
        a step without dependencies published as any message, the others waiting, and
        every step's row and edges; the message ids, in order. A workflow name already
        used raises :class:`~sqlmq.errors.PublishError` and writes nothing."""
        ...

    def publish_workflow_sync(
        self, workflow: str, steps: Sequence[StepSpec],
        executor: Connection | Session | Any | None = None,
    ) -> list[int]:
        """The same, for code without an event loop."""
        ...

    async def workflow_steps(self, workflow: str) -> list[StepStatus]:
        """Workflow ``workflow``'s steps in the order they were added (none: unknown)."""
        ...

    async def workflows(self, limit: int) -> list[WorkflowSummary]:
        """The ``limit`` newest workflows, newest first."""
        ...

    async def dependencies(self, msg_id: int) -> list[Dependency]:
        """The dependencies of step ``msg_id`` as they ended (none: not a step, or a
        step without any)."""
        ...

    async def signal(self, msg_id: int, name: str, payload: bytes | None) -> bool:
        """Keep signal ``name`` (``payload``, encoded) for message ``msg_id``, replacing
        one of that name, and if the message waits for it (deferred by
        ``msg.wait_for``), make it due now, in one transaction (the message's row locked,
        as a settle's defer locks it: a signal and a wait never miss each other). False,
        and nothing kept, if the message ended or does not exist."""
        ...

    async def received_signal(self, msg_id: int, deliveries: int) -> Signal | None:
        """The signal message ``msg_id`` waited for, as delivery ``deliveries`` reads it:
        the one that came (marked read by that delivery), a timeout (no signal came), or
        None if it waited for nothing."""
        ...

    async def forget_ended_signals(self, before: datetime, limit: int) -> int:
        """Delete the signals, sent before ``before``, of up to ``limit`` messages that are
        no longer in the table (they ended; no wait can read them): how many messages'. A
        message requeued from the archive keeps those sent since ``before``."""
        ...


__all__ = ["WorkflowsContract"]
