"""The message lifecycle, written once: its states, and :func:`decide`, which turns what
became of one delivery into the settlement a flush writes.

::

    PENDING ──acquire──▶ PROCESSING ──ack──────────────▶ COMPLETED (archive)
       ▲                    │  │ ──reject / no retries──▶ FAILED    (archive)
       │                    │  │ ──past its expiry──────▶ EXPIRED   (archive, never run)
       │                    │  │ ──cancelled, no success▶ CANCELLED (archive)
       │                    │  └──nack, retry allowed──▶ RETRYABLE ──acquire──▶ PROCESSING
       ├──lease expired / released on stop──┘
       └──defer (state saved; neither an attempt nor a delivery against max_deliveries)

``Broker.cancel`` archives a waiting message CANCELLED at once; a running one is flagged, its
handler sees ``msg.cancel_requested``, and any result but a success is archived CANCELLED
(a flagged message that goes back to waiting is archived CANCELLED when next acquired,
without running).

PENDING, PROCESSING and RETRYABLE rows live in the message table; COMPLETED, FAILED,
EXPIRED and CANCELLED rows are moved to the archive in the same transaction that deletes them.
``docs/lifecycle.md`` draws every transition and names the :class:`Ending` that leads to each.

:func:`decide` is pure: no I/O, no clock, no logging (the runtime logs). The only code it
calls that is not its own is the subscriber's retry strategy. It lives here, below the
records and the message, so that nothing it needs imports the runtime.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from datetime import datetime
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .retry import RetryStrategy, delay_seconds
from .tracebacks import handler_traceback

if TYPE_CHECKING:
    from .new_messages import NewMessages


class State(StrEnum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    RETRYABLE = "RETRYABLE"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"  # acquired after its ``expires_at``: archived without running
    CANCELLED = "CANCELLED"  # Broker.cancel: never delivered, or its result given up
    WAITING = "WAITING"  # a workflow's step whose dependencies have not all ended


class AckPolicy(StrEnum):
    """What a handler's return or exception means when it did not settle by hand.

    ``ACK``: archive COMPLETED whatever happened (the error, if any, is recorded).
    ``NACK_ON_ERROR`` (default): an exception is a nack, so the retry strategy decides.
    ``REJECT_ON_ERROR``: an exception archives the message FAILED at once.
    ``MANUAL``: the handler calls ``msg.ack()``/``nack()``/``reject()``; returning or
    raising without doing so is treated as a nack, with a warning.
    """

    ACK = "ACK"
    NACK_ON_ERROR = "NACK_ON_ERROR"
    REJECT_ON_ERROR = "REJECT_ON_ERROR"
    MANUAL = "MANUAL"


class Archive(StrEnum):
    """Which ended messages a subscriber keeps in the archive (``archive=``); the others are
    deleted by the settle's statement that would have archived them, fenced the same way.

    ``ALL`` (default): every one. ``FAILED``: all but COMPLETED (a busy queue whose
    successes nobody reads; its failures, cancellations and expiries stay to be looked at
    and requeued). ``NONE``: none (the seed's delete mode; dead letters are still logged
    and passed to ``on_dead_letter`` hooks, then gone).
    """

    ALL = "all"
    FAILED = "failed"
    NONE = "none"

    def keeps(self, outcome: Outcome) -> bool:
        return self is Archive.ALL or (self is Archive.FAILED and outcome is not Outcome.COMPLETE)


class Outcome(StrEnum):
    """What a flush writes for one delivery."""

    COMPLETE = State.COMPLETED.value  # archive as COMPLETED
    FAIL = State.FAILED.value  # archive as FAILED
    EXPIRE = State.EXPIRED.value  # archive as EXPIRED
    RETRY = "RETRY"  # back to the table as RETRYABLE, after a delay
    RELEASE = "RELEASE"  # back to PENDING, no attempt counted (stop, quarantine, a fault)
    DEFER = "DEFER"  # back to PENDING until ``delay``/``at``, with the handler's saved state
    CANCEL = State.CANCELLED.value  # archive as CANCELLED

    @property
    def archives(self) -> bool:
        """Whether the settle moves the row to the archive (the engines' ``landed`` looks
        for it there)."""
        return self in (Outcome.COMPLETE, Outcome.FAIL, Outcome.EXPIRE, Outcome.CANCEL)


class Ending(Enum):
    """What became of one delivery, as the runtime saw it: the input of :func:`decide`."""

    #: The handler ran: it returned, or raised ``error``; it may have decided by hand.
    HANDLED = "handled"
    #: The handler's argument could not be decoded from the payload (a ``DecodeError``
    #: before any manual decision): archived FAILED, not counted as an attempt.
    UNDECODABLE_BODY = "undecodable body"
    #: The engine could not decode the row itself (``Delivery.defect``): archived FAILED
    #: without running; its history stays as stored (it may be the column at fault).
    UNDECODABLE_ROW = "undecodable row"
    #: The delivery's number is over ``max_deliveries``: archived FAILED without running.
    MAX_DELIVERIES = "max deliveries"
    #: Acquired at or after its ``expires_at``: archived EXPIRED without running, not
    #: counted as an attempt.
    EXPIRED = "expired"
    #: Never started (a stop, or a suspect that must run alone): back to PENDING at once,
    #: the delivery refunded.
    UNSTARTED = "unstarted"
    #: Cut short by a fault of sqlmq's own or a worker cancelled from outside (``error``):
    #: back to PENDING after ``ABANDON_DELAY``, the delivery spent.
    ABANDONED = "abandoned"
    #: Still running when a stop's graceful timeout ran out: back to PENDING at once.
    CUT_SHORT = "cut short"
    #: Acquired with a cancellation asked for (``Broker.cancel`` while it ran, and it went
    #: back to waiting): archived CANCELLED without running.
    CANCELLED = "cancelled"


class Decision:
    """A handler's manual settlement of its message (``msg.ack()``, ``nack()``, ``reject()``,
    ``defer()``)."""

    __slots__ = ("at", "delay", "kind", "reason", "saved_state", "waits_for")

    def __init__(self, kind: str, delay: float | None = None, reason: str | None = None,
                 at: datetime | None = None, saved_state: bytes | None = None,
                 waits_for: str | None = None):
        self.kind = kind  # "ack" | "nack" | "reject" | "defer"
        self.delay = delay
        self.reason = reason
        self.at = at  # defer: the moment it is due again (else after ``delay``)
        self.saved_state = saved_state  # defer: the state to save, encoded
        self.waits_for = waits_for  # defer: the signal that makes it due at once


class Delivered(Protocol):
    """What :func:`decide` reads of a delivery (:class:`sqlmq.records.Delivery` has it)."""

    @property
    def id(self) -> int: ...
    @property
    def deliveries(self) -> int: ...
    @property
    def attempts(self) -> int: ...
    @property
    def history(self) -> list[dict[str, Any]]: ...
    @property
    def defect(self) -> str | None: ...
    @property
    def acquired_at(self) -> datetime: ...
    @property
    def expires_at(self) -> datetime | None: ...
    @property
    def defers(self) -> int: ...
    @property
    def cancel_requested(self) -> bool: ...


class Policy(Protocol):
    """What :func:`decide` reads of a subscriber (:class:`sqlmq.subscriber.SubscriberConfig`
    has it; ``max_deliveries`` is resolved from ``"auto"`` by then)."""

    @property
    def ack_policy(self) -> AckPolicy: ...
    @property
    def retry(self) -> RetryStrategy: ...
    @property
    def max_deliveries(self) -> int | Literal["auto"] | None: ...
    @property
    def archive(self) -> Archive: ...


#: How many past delivery endings a message keeps (newest last).
HISTORY_LIMIT = 10

#: How much of a handler's traceback the archive keeps (its last lines: where it failed).
TRACEBACK_LIMIT = 4096

#: Seconds before a delivery given back after a fault of the runtime may run again: a fault
#: that repeats then costs a delivery a second rather than spinning.
ABANDON_DELAY = 1.0


@dataclass(slots=True)  # not frozen: frozen dataclasses are built 4x slower, batches feel it
class Settlement:
    """The result of one delivery, waiting to be flushed. Treat it as immutable."""

    id: int
    deliveries: int
    outcome: Outcome
    error: str | None = None
    delay: float = 0.0  # for RETRY
    refund: bool = False  # for RELEASE: the delivery never started, give it back
    attempted: bool = True  # the handler ran: counts as an attempt
    history: list[dict[str, Any]] | None = None  # the new history, when it changed
    #: What a pipeline step publishes onward (its handler's return value, encoded): written
    #: in the settle's transaction, and only if this settlement lands (see
    #: :mod:`sqlmq.pipeline`). The runtime sets it on a COMPLETE settlement only.
    outputs: NewMessages | None = None
    #: For DEFER: the moment it is due again (None: after ``delay`` seconds) and the state
    #: saved on the row (encoded; None: none).
    at: datetime | None = None
    saved_state: bytes | None = None
    #: False: if this settlement archives the message, it deletes the row instead (the
    #: subscriber's :class:`Archive` setting, applied by :func:`decide`).
    keep: bool = True
    #: What its handler returned, encoded as :func:`sqlmq.codec.encode_state` stores a value,
    #: kept on the archive row by the settle's transaction if this settlement lands (a
    #: subscriber with ``results=True``; see :mod:`sqlmq.results`). COMPLETE only.
    result: bytes | None = None
    #: A caller may be waiting for this message's ending (``Broker.result``): the settle
    #: announces it where the database can (PostgreSQL's NOTIFY, in its transaction).
    answers: bool = False
    #: It is a workflow's step: an ending it writes releases or cancels the steps that wait
    #: on it, in the settle's transaction (see :mod:`sqlmq.workflows`).
    step: bool = False
    #: For DEFER: the signal it waits for (``msg.wait_for``): due at once if one came
    #: already, else when it comes (``Broker.signal``) or after the delay.
    waits_for: str | None = None


def decide(d: Delivered, policy: Policy, error: BaseException | None = None,
           decision: Decision | None = None, ending: Ending = Ending.HANDLED) -> Settlement:
    """The settlement that follows ``ending`` of delivery ``d`` under ``policy``.

    ``error`` is what the handler raised (or, for ``ABANDONED``, the fault), ``decision``
    its manual ack/nack/reject. The history entries written here carry no ``at``: the
    runtime never reads the clock, and the engine's settle gives the entry it appends the
    database's time. Pure apart from the retry strategy, which is the subscriber's own.

    A delivery whose cancellation was asked for (and seen by the runtime) ends CANCELLED
    unless it succeeded: a failure, a retry, a defer or a release would run it again."""
    settlement = _decide(d, policy, error, decision, ending)
    if d.cancel_requested and settlement.outcome is not Outcome.COMPLETE:
        settlement = _cancelled(d, policy, error)
    if policy.archive is not Archive.ALL:
        if settlement.outcome.archives:
            settlement.keep = policy.archive.keeps(settlement.outcome)
        elif settlement.outcome is Outcome.DEFER:  # archived CANCELLED if cancelled meanwhile
            settlement.keep = policy.archive.keeps(Outcome.CANCEL)
    return settlement


def _decide(d: Delivered, policy: Policy, error: BaseException | None,
            decision: Decision | None, ending: Ending) -> Settlement:
    if ending is Ending.HANDLED:
        if decision is None:
            if error is None:
                if policy.ack_policy is AckPolicy.MANUAL:
                    return _nack(d, policy, None, None,
                                 "returned without ack/nack/reject (MANUAL)")
                return Settlement(d.id, d.deliveries, Outcome.COMPLETE)
            if policy.ack_policy is AckPolicy.ACK:
                return _complete(d, error)
            if policy.ack_policy is AckPolicy.REJECT_ON_ERROR:
                return _fail(d, failure_text(error), "error")
            return _nack(d, policy, error, None)
        if decision.kind == "ack":
            return _complete(d, error)
        if decision.kind == "reject":
            reason = storable(decision.reason or (failure_text(error) if error else "rejected"))
            return _fail(d, reason, "rejected")
        if decision.kind == "defer":
            return _defer(d, decision)
        return _nack(d, policy, error, decision.delay)
    return _UNHANDLED[ending](d, policy, error)


def unrunnable(d: Delivered, policy: Policy) -> Ending | None:
    """Why ``d`` must end without its handler running (``UNDECODABLE_ROW``, ``EXPIRED``,
    ``MAX_DELIVERIES``), or None: run it. Expiry compares two times the database wrote (the
    acquire's and the publish's), so no host's clock takes part."""
    if d.defect is not None:
        return Ending.UNDECODABLE_ROW
    if d.cancel_requested:
        return Ending.CANCELLED
    expires_at = d.expires_at
    if expires_at is not None and d.acquired_at >= expires_at:
        return Ending.EXPIRED
    limit = policy.max_deliveries  # exceeds_max_deliveries(), inlined: once per message
    if limit is not None and d.deliveries - d.defers > limit:  # type: ignore[operator]
        return Ending.MAX_DELIVERIES
    return None


def exceeds_max_deliveries(d: Delivered, policy: Policy) -> bool:
    """A message that kills its process never produces a result; only this stops it. The
    deliveries that ended in a defer are not counted: a cooperative task may defer itself
    for as long as it likes."""
    limit = policy.max_deliveries
    return limit is not None and d.deliveries - d.defers > limit  # type: ignore[operator]


def _complete(d: Delivered, error: BaseException | None) -> Settlement:
    return Settlement(d.id, d.deliveries, Outcome.COMPLETE,
                      error=failure_text(error) if error else None)


def _fail(d: Delivered, reason: str, ended: str, attempted: bool = True) -> Settlement:
    history = append_history(d.history, history_entry(d.deliveries, ended, error=reason))
    return Settlement(d.id, d.deliveries, Outcome.FAIL, error=reason, attempted=attempted,
                      history=history)


def _nack(d: Delivered, policy: Policy, error: BaseException | None, delay: float | None,
          reason: str | None = None) -> Settlement:
    reason = reason or (failure_text(error) if error else "nacked")
    attempt = d.attempts + 1
    try:
        allowed = delay_seconds(policy.retry, attempt, error)
    except Exception as exc:
        return _fail(d, f"retry strategy failed ({error_text(exc)}); last error: {reason}",
                     "error")
    if allowed is None:
        return _fail(d, f"retries exhausted after {attempt} attempt(s): {reason}",
                     "error" if error else "nacked")
    history = append_history(
        d.history, history_entry(d.deliveries, "error" if error else "nacked", error=reason)
    )
    return Settlement(d.id, d.deliveries, Outcome.RETRY, error=reason,
                      delay=allowed if delay is None else delay, history=history)


def _undecodable_body(d: Delivered, policy: Policy, error: BaseException | None) -> Settlement:
    return _fail(d, f"decode error: {error}", "decode_error", attempted=False)


def _undecodable_row(d: Delivered, policy: Policy, error: BaseException | None) -> Settlement:
    # Its history stays as stored (it may be the column at fault): nothing is rewritten.
    return Settlement(d.id, d.deliveries, Outcome.FAIL,
                      error=storable(d.defect or "undecodable row"), attempted=False)


def _defer(d: Delivered, decision: Decision) -> Settlement:
    """Back to waiting with the state saved: not an attempt (the retry strategy does not
    see it), and its ``deferred`` history entry is what ``landed`` recognises."""
    history = append_history(d.history, history_entry(d.deliveries, "deferred"))
    return Settlement(d.id, d.deliveries, Outcome.DEFER, delay=decision.delay or 0.0,
                      attempted=False, history=history, at=decision.at,
                      saved_state=decision.saved_state, waits_for=decision.waits_for)


def _cancelled(d: Delivered, policy: Policy, error: BaseException | None) -> Settlement:
    reason = "cancelled" if error is None else f"cancelled; it ended with {error_text(error)}"
    history = append_history(d.history, history_entry(d.deliveries, "cancelled", error=reason))
    return Settlement(d.id, d.deliveries, Outcome.CANCEL, error=reason, attempted=False,
                      history=history)


def _max_deliveries(d: Delivered, policy: Policy, error: BaseException | None) -> Settlement:
    done = d.deliveries - d.defers
    reason = f"max deliveries exceeded ({done} > {policy.max_deliveries})"
    return _fail(d, reason, "max_deliveries", attempted=False)


def _expired(d: Delivered, policy: Policy, error: BaseException | None) -> Settlement:
    reason = f"expired at {d.expires_at.isoformat() if d.expires_at else '?'} before it ran"
    history = append_history(d.history, history_entry(d.deliveries, "expired", error=reason))
    return Settlement(d.id, d.deliveries, Outcome.EXPIRE, error=reason, attempted=False,
                      history=history)


def _unstarted(d: Delivered, policy: Policy, error: BaseException | None) -> Settlement:
    return Settlement(d.id, d.deliveries, Outcome.RELEASE, refund=True, attempted=False)


def _abandoned(d: Delivered, policy: Policy, error: BaseException | None) -> Settlement:
    reason = (f"sqlmq failed handling it: {error_text(error)}" if isinstance(error, Exception)
              else "its worker was cancelled")
    return Settlement(d.id, d.deliveries, Outcome.RELEASE, error=reason, delay=ABANDON_DELAY,
                      attempted=False)


def _cut_short(d: Delivered, policy: Policy, error: BaseException | None) -> Settlement:
    return Settlement(d.id, d.deliveries, Outcome.RELEASE, error="cancelled on shutdown",
                      attempted=False)


_UNHANDLED = {
    Ending.UNDECODABLE_BODY: _undecodable_body,
    Ending.UNDECODABLE_ROW: _undecodable_row,
    Ending.MAX_DELIVERIES: _max_deliveries,
    Ending.EXPIRED: _expired,
    Ending.UNSTARTED: _unstarted,
    Ending.ABANDONED: _abandoned,
    Ending.CUT_SHORT: _cut_short,
    Ending.CANCELLED: _cancelled,
}


# ---- history -------------------------------------------------------------------------------


def history_entry(
    delivery: int, ended: str, at: datetime | None = None, error: str | None = None
) -> dict[str, Any]:
    """One ending for a message's ``history``; ``at`` only where the caller has the
    database's time (else the engine that writes the entry adds it)."""
    entry: dict[str, Any] = {"delivery": delivery, "ended": ended}
    if at is not None:
        entry["at"] = at.isoformat()
    if error:  # its first line: a handler's traceback stays in the error column only
        entry["error"] = error.split("\n", 1)[0][:500]
    return entry


def append_history(history: list[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [*history, entry][-HISTORY_LIMIT:]


def records_ending(entry: Any, delivery: int, ended: str) -> bool:
    """Whether history ``entry`` says delivery ``delivery`` ended ``ended``, whatever else
    it holds (its ``at``, which the engine adds as it writes the entry)."""
    return isinstance(entry, dict) and entry.get("ended") == ended and \
        entry.get("delivery") == delivery


# ---- error text ----------------------------------------------------------------------------


def error_text(exc: BaseException) -> str:
    """One line naming the error. ``str()`` of a user's exception may itself fail: that
    must not take the worker down with it."""
    try:
        message = str(exc)
    except Exception:
        message = "<str() of the exception failed>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return storable(text[:2000])


def failure_text(exc: BaseException) -> str:
    """What a failed handler leaves in the error column: the one line of :func:`error_text`,
    then the traceback from the user's code on (:func:`~.tracebacks.handler_traceback`),
    bounded to its last ``TRACEBACK_LIMIT`` characters."""
    trace = "".join(traceback.format_exception(type(exc), exc, handler_traceback(exc)))
    trace = trace.rstrip()
    if len(trace) > TRACEBACK_LIMIT:
        trace = "…" + trace[-TRACEBACK_LIMIT:]
    return f"{error_text(exc)}\n\n{storable(trace)}"


def storable(text: str) -> str:
    """Text every database accepts in a column and in JSON. A NUL or a lone surrogate in one
    handler's error would otherwise fail every flush of its batch, forever."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
