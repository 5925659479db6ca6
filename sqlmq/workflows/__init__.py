"""Workflows: messages that wait for other messages.

A workflow is a set of steps published in one transaction, each a message that may name
the steps it waits for. A step waits (in state WAITING: not acquirable, not counted as
ready) until every one of them has ended; the settle that ends the last one publishes it,
in the same transaction, fenced as the settle is, so a crash cannot separate the two and a
stale delivery releases nothing. A dependency that ends FAILED, CANCELLED or EXPIRED
cancels the steps that wait on it, transitively, unless a step runs on failure
(``on_failure="run"``). A step's handler reads its dependencies' endings and results with
``await msg.dependencies()``.

A running handler waits for an outside event without holding a worker with
``msg.wait_for(name, timeout=…)`` (a defer until ``Broker.signal`` sends it); its next
delivery reads ``await msg.signal()``. See docs/workflows.md.
"""

from __future__ import annotations

from .flow import Step, Workflow
from .records import (
    STEP_HEADER,
    WORKFLOW_HEADER,
    Dependency,
    OnFailure,
    Signal,
    StepStatus,
    WorkflowStatus,
    WorkflowSummary,
)

__all__ = ["STEP_HEADER", "WORKFLOW_HEADER", "Dependency", "OnFailure", "Signal", "Step",
           "StepStatus", "Workflow", "WorkflowStatus", "WorkflowSummary"]
