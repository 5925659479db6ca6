"""Workflows on the SQL engines (schema version 23; see :mod:`sqlmq.workflows`).

* :mod:`.publishing`: a workflow's publish;
* :mod:`.steps`: what the settle, cancel or requeue of a step does to the steps waiting on
  it, in that transaction (:mod:`.released`: the UPDATEs that release a step);
* :mod:`.reads`: the status, the list, a step's dependencies;
* :mod:`.signals`: signals sent to messages that wait for them.
"""

from __future__ import annotations

from .publishing import StepPublish
from .reads import WorkflowReads
from .signals import SignalStatements
from .steps import StepStatements


class WorkflowStatements(StepPublish, StepStatements, WorkflowReads, SignalStatements):
    """The workflows half of the engine contract for :class:`~..engine.SqlEngine`."""


__all__ = ["WorkflowStatements"]
