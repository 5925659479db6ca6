"""What a handler's run leaves besides its outcome: the state its defer saved, a pipeline
step's outputs (:mod:`sqlmq.pipeline`), the result a subscriber keeps
(:mod:`sqlmq.results`). Each is written by the settle of its message, so each must be
writable: one that is not (too large, not encodable, refused by a publish hook) fails the
run as if its handler had raised that error, and the retry strategy decides.

A batch handler's run (:mod:`.batches`) carries the same, spread over its messages: the
i-th item of the list it returned is the i-th message's result, and its outputs ride on
the first message that completes (the batch is written in one settle). A result that
cannot be kept fails its own message only; a return value that is no list of one result
per message fails the whole batch, as no message can be told which item is its own."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import PayloadTooLarge, PipelineError, UnstorableResult
from ..lifecycle import Decision, Outcome, Settlement, decide
from ..middleware import MiddlewareError
from ..pipeline import onward, onward_each
from ..records import Delivery, NewMessages
from ..results.keeping import kept, kept_each
from ..workflows.records import WORKFLOW_HEADER

if TYPE_CHECKING:
    from ..message import Message
    from ..subscriber import SubscriberConfig

log = logging.getLogger("sqlmq")


def carried(d: Delivery, cfg: SubscriberConfig, handler: str, error: BaseException | None,
            decision: Decision | None, result: Any,
            publish_output: Callable[[NewMessages], None] | None,
            ) -> tuple[Settlement, BaseException | None, Decision | None]:
    """The settlement of delivery ``d`` whose ``handler`` raised ``error`` (or returned
    ``result``) after ``decision``, with what it carries; and the error and decision it
    was decided on (the run's own, or the error that failed what it carries).
    ``publish_output``: the middleware's ``publish`` hooks on a pipeline's outputs."""
    settlement = decide(d, cfg, error, decision)
    saved = settlement.saved_state
    if saved is not None and len(saved) > cfg.max_payload_bytes:
        error, decision = PayloadTooLarge(
            f"the state message {d.id} saved with defer() is {len(saved)} bytes, over the "
            f"limit of {cfg.max_payload_bytes} (max_payload_bytes)"), None
        settlement = decide(d, cfg, error)
    completed = settlement.outcome is Outcome.COMPLETE and error is None
    if cfg.publish_to is not None and completed:
        try:
            settlement.outputs = onward(result, cfg.publish_to, cfg.max_payload_bytes, handler)
            if settlement.outputs is not None and publish_output is not None:
                publish_output(settlement.outputs)
        except (PipelineError, MiddlewareError) as exc:
            # the step failed (its output, or a publish hook on it)
            error, decision = exc, None
            settlement = decide(d, cfg, error)
            completed = False
    # A step's result is read by its dependents; None is what a missing one reads as.
    if completed and (cfg.results or (WORKFLOW_HEADER in d.headers and result is not None)):
        try:
            settlement.result = kept(result, cfg.max_payload_bytes, handler, d.id)
        except UnstorableResult as exc:
            error, decision = exc, None
            settlement = decide(d, cfg, error)
    return settlement, error, decision


def carried_batch(runs: list[Delivery], msgs: list[Message], settlements: list[Settlement],
                  cfg: SubscriberConfig, handler: str, result: Any,
                  publish_output: Callable[[NewMessages, Message], None] | None,
                  ) -> list[tuple[Delivery, UnstorableResult]]:
    """Put what a batch handler that returned ``result`` carries on ``settlements`` (those
    of ``runs``, decided without an error), in place: each message's result, then the
    pipeline's outputs. Returns the messages whose own result could not be kept, each with
    its error (its settlement is then that failure's). Raises the error that fails the
    whole batch: a value that is not one result per message
    (:class:`~sqlmq.errors.UnstorableResult`), outputs that cannot be published
    (:class:`~sqlmq.errors.PipelineError`, :class:`~sqlmq.middleware.MiddlewareError`)."""
    failed: list[tuple[Delivery, UnstorableResult]] = []
    completing = [i for i, s in enumerate(settlements) if s.outcome is Outcome.COMPLETE]
    if cfg.results and completing:  # else no message takes a result from the list
        values = kept_each(result, len(runs), handler)
        for i in completing:
            d = runs[i]
            try:
                settlements[i].result = kept(values[i], cfg.max_payload_bytes, handler, d.id)
            except UnstorableResult as exc:
                settlements[i] = decide(d, cfg, exc)
                failed.append((d, exc))
    if cfg.publish_to is not None:
        _publish_onward(msgs, settlements, cfg.publish_to, cfg.max_payload_bytes, handler,
                        result, publish_output)
    return failed


def _publish_onward(msgs: list[Message], settlements: list[Settlement], queue: str,
                    max_payload_bytes: int, handler: str, result: Any,
                    publish_output: Callable[[NewMessages, Message], None] | None) -> None:
    """Put what the batch returned on the first settlement that completes its message: the
    batch is written in one settle, so the outputs land with the batch's archive."""
    outputs = onward_each(result, queue, max_payload_bytes, handler)
    if outputs is None:
        return
    for s, msg in zip(settlements, msgs, strict=True):
        if s.outcome is Outcome.COMPLETE:
            s.outputs = outputs
            if publish_output is not None:
                publish_output(outputs, msg)
            return
    log.warning("batch handler %s returned %d outputs, but no message of its batch "
                "completed (each was settled by hand other than acknowledged, or its result "
                "could not be kept): nothing is published", handler, len(outputs.payloads))


__all__ = ["carried", "carried_batch"]
