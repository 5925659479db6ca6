"""The broker's workflow calls: build one, read its status, list them, cancel one; and
send a signal to a message that waits for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..codec import encode_state
from ..errors import PayloadTooLarge, UnknownWorkflow
from ..lifecycle import State
from ..records import Cancellation
from .flow import Workflow, checked_name
from .records import WorkflowStatus, WorkflowSummary

if TYPE_CHECKING:
    from ..engines.contract import Engine
    from ..wakeups import Wakeups


class Workflows:
    """Workflows, for :class:`sqlmq.Broker` (which sets these attributes)."""

    max_payload_bytes: int
    _engine: Engine
    _wakeups: Wakeups

    def workflow(self, name: str) -> Workflow:
        """A new workflow named ``name`` (unique: it names one publish). Add its steps,
        then ``await flow.publish()``."""
        return Workflow(name, self._engine, self._wakeups, self.max_payload_bytes)

    async def workflow_status(self, name: str) -> WorkflowStatus:
        """Each step of workflow ``name`` with its state, attempts, error and result.
        Raises :class:`~sqlmq.errors.UnknownWorkflow` for a name no publish used."""
        steps = await self._engine.workflow_steps(name)
        if not steps:
            raise UnknownWorkflow(f"no workflow is named {name!r}")
        return WorkflowStatus(name, steps)

    async def workflows(self, limit: int = 50) -> list[WorkflowSummary]:
        """The ``limit`` newest workflows, newest first, with their steps' counts."""
        return await self._engine.workflows(limit)

    async def signal(self, msg_id: int, name: str, payload: Any = None) -> bool:
        """Send signal ``name`` with ``payload`` (bytes, str or a JSON value) to message
        ``msg_id``: a message waiting for it (``msg.wait_for(name)``) is due at once, and
        one that waits for it later takes it then. False if the message ended or does not
        exist (nothing is kept)."""
        checked_name(name, "signal name")
        stored = None if payload is None else encode_state(payload)
        if stored is not None and len(stored) > self.max_payload_bytes:
            raise PayloadTooLarge(f"signal {name!r} for message {msg_id}: {len(stored)} bytes,"
                                  f" over the limit of {self.max_payload_bytes} "
                                  f"(max_payload_bytes)")
        return await self._engine.signal(msg_id, name, stored)

    async def cancel_workflow(self, name: str) -> dict[str, Cancellation]:
        """Cancel every step of workflow ``name`` that has not ended: a waiting or ready
        one is archived CANCELLED, a running one asked to stop (as ``cancel`` does). The
        waiting steps go first, so that no running step that completes meanwhile can
        release one. Returns each step's cancellation, by step name."""
        status = await self.workflow_status(name)
        left = [s for s in status.steps if not s.ended]
        left.sort(key=lambda s: s.state != State.WAITING)
        return {s.name: await self._engine.cancel(s.id) for s in left}


__all__ = ["Workflows"]
