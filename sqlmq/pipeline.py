"""Pipelines: a step's handler returns a value, and sqlmq publishes it onward atomically.

::

    @broker.subscriber("orders", publish_to="invoices")
    async def bill(order: Order) -> Invoice:
        return make_invoice(order)

The return value is encoded as ``publish`` encodes a body (bytes, str, JSON, a pydantic
model) into the settlement of the input message (:attr:`Settlement.outputs
<sqlmq.lifecycle.Settlement.outputs>`), and the engine inserts it in the transaction that
archives the input (:mod:`sqlmq.engines.sql.settle_onward`). So a hop between two queues is
exactly-once: whatever crashes, the output exists if and only if the input was archived
COMPLETED, and exists once. The handler itself may still run more than once (at least
once, as every handler); only one of its runs leaves an output.

A handler that returns None publishes nothing (a filter step). Only a run that ends
COMPLETED publishes: a failed, retried or rejected input leaves no output. A return value
that cannot be published (not encodable, over ``max_payload_bytes``) fails the step as if
the handler had raised :class:`~sqlmq.errors.PipelineError`: the retry strategy decides,
then the dead letters keep the input with the reason.
"""

from __future__ import annotations

from typing import Any

from .errors import PipelineError
from .lifecycle import error_text
from .new_messages import NewMessages
from .publishing import prepare

__all__ = ["onward", "onward_each"]


def onward(result: Any, queue: str, max_payload_bytes: int, handler: str) -> NewMessages | None:
    """What ``handler``'s return value ``result`` publishes to ``queue``: None for None."""
    if result is None:
        return None
    try:
        return prepare(queue, [result], headers=None, delay=None, at=None,
                       max_payload_bytes=max_payload_bytes)
    except Exception as exc:
        raise PipelineError(f"handler {handler} returned a value that cannot be published to "
                            f"queue {queue!r}: {error_text(exc)}") from exc


def onward_each(result: Any, queue: str, max_payload_bytes: int,
                handler: str) -> NewMessages | None:
    """What a batch handler's return value publishes to ``queue``: one message per item of
    the list it returned, None for None or an empty list."""
    if result is None:
        return None
    if not isinstance(result, (list, tuple)):
        raise PipelineError(f"batch handler {handler} returned a {type(result).__name__}: with "
                            f"publish_to, a batch handler returns a list (one message per item) "
                            f"or None")
    if not result:
        return None
    try:
        return prepare(queue, list(result), headers=None, delay=None, at=None,
                       max_payload_bytes=max_payload_bytes)
    except Exception as exc:
        raise PipelineError(f"batch handler {handler} returned a list that cannot be published "
                            f"to queue {queue!r}: {error_text(exc)}") from exc
