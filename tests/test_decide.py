"""decide(): every transition of the chart in docs/lifecycle.md that a delivery's ending
makes, without a database. The transitions the engine makes on its own (acquire, recovery
of an expired lease) are the contract suite's."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sqlmq.errors import DecodeError
from sqlmq.lifecycle import (
    ABANDON_DELAY,
    HISTORY_LIMIT,
    TRACEBACK_LIMIT,
    AckPolicy,
    Archive,
    Decision,
    Ending,
    Outcome,
    Settlement,
    decide,
    exceeds_max_deliveries,
    unrunnable,
)
from sqlmq.retry import MAX_DELAY, Retry, RetryStrategy


@dataclass
class D:
    """Just what decide() reads of a delivery."""

    id: int = 7
    deliveries: int = 1
    attempts: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    defect: str | None = None
    acquired_at: datetime = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    expires_at: datetime | None = None
    defers: int = 0
    cancel_requested: bool = False


@dataclass
class P:
    """Just what decide() reads of a subscriber."""

    ack_policy: AckPolicy = AckPolicy.NACK_ON_ERROR
    retry: RetryStrategy = field(default_factory=lambda: Retry.constant(2.0, max_attempts=3))
    max_deliveries: int | None = 10
    archive: Archive = Archive.ALL


def boom() -> ValueError:
    try:
        raise ValueError("boom")
    except ValueError as exc:
        return exc


def ended(s: Settlement) -> str | None:
    return s.history[-1]["ended"] if s.history else None


# ---- the handler ran ---------------------------------------------------------------------

# (ack policy, raised?, manual decision) -> (outcome, history "ended", error starts with)
HANDLED = [
    # returned, no decision: the policy decides
    (AckPolicy.NACK_ON_ERROR, False, None, Outcome.COMPLETE, None, None),
    (AckPolicy.ACK, False, None, Outcome.COMPLETE, None, None),
    (AckPolicy.REJECT_ON_ERROR, False, None, Outcome.COMPLETE, None, None),
    (AckPolicy.MANUAL, False, None, Outcome.RETRY, "nacked",
     "returned without ack/nack/reject (MANUAL)"),
    # raised, no decision
    (AckPolicy.NACK_ON_ERROR, True, None, Outcome.RETRY, "error", "ValueError: boom"),
    (AckPolicy.ACK, True, None, Outcome.COMPLETE, None, "ValueError: boom"),
    (AckPolicy.REJECT_ON_ERROR, True, None, Outcome.FAIL, "error", "ValueError: boom"),
    (AckPolicy.MANUAL, True, None, Outcome.RETRY, "error", "ValueError: boom"),
    # decided by hand: the decision stands whatever the policy, raised or not
    *[(policy, raised, Decision("ack"), Outcome.COMPLETE, None,
       "ValueError: boom" if raised else None)
      for policy in AckPolicy for raised in (False, True)],
    *[(policy, raised, Decision("reject", reason="bad input"), Outcome.FAIL, "rejected",
       "bad input") for policy in AckPolicy for raised in (False, True)],
    *[(policy, raised, Decision("nack"), Outcome.RETRY, "error" if raised else "nacked",
       "ValueError: boom" if raised else "nacked")
      for policy in AckPolicy for raised in (False, True)],
]


@pytest.mark.parametrize(("policy", "raised", "decision", "outcome", "history", "error"),
                         HANDLED)
def test_a_handled_delivery_settles_by_policy_and_decision(
    policy: AckPolicy, raised: bool, decision: Decision | None, outcome: Outcome,
    history: str | None, error: str | None,
) -> None:
    d = D(history=[{"delivery": 0, "ended": "lease_expired"}])
    s = decide(d, P(ack_policy=policy), boom() if raised else None, decision)
    assert (s.id, s.deliveries, s.outcome, s.attempted, s.refund) == (7, 1, outcome, True, False)
    assert ended(s) == history
    if error is None:
        assert s.error is None
    else:
        assert s.error is not None and s.error.startswith(error)
    if history is None:
        assert s.history is None  # COMPLETE leaves the history as stored
    else:
        assert s.history is not None
        assert s.history[0] == {"delivery": 0, "ended": "lease_expired"}
        assert s.history[-1]["delivery"] == 1 and "at" not in s.history[-1]
    if outcome is Outcome.RETRY:
        assert s.delay == 2.0


def test_a_failure_keeps_its_traceback_and_the_history_its_first_line() -> None:
    s = decide(D(), P(ack_policy=AckPolicy.REJECT_ON_ERROR), boom())
    assert s.error is not None
    first, trace = s.error.split("\n\n", 1)
    assert first == "ValueError: boom"
    assert trace.startswith("Traceback") and "raise ValueError" in trace
    assert s.history == [{"delivery": 1, "ended": "error", "error": "ValueError: boom"}]


def test_a_long_traceback_is_bounded_to_its_end() -> None:
    try:
        raise ValueError("x" * 5000 + "END")
    except ValueError as exc:
        error = exc
    s = decide(D(), P(ack_policy=AckPolicy.ACK), error)
    assert s.outcome is Outcome.COMPLETE and s.error is not None
    first, trace = s.error.split("\n\n", 1)
    assert len(first) == 2000  # the one line is bounded too
    assert trace.startswith("…") and trace.endswith("END")
    assert len(trace) == TRACEBACK_LIMIT + 1


def test_a_reject_without_reason_names_the_error_or_says_rejected() -> None:
    assert decide(D(), P(), None, Decision("reject")).error == "rejected"
    raised = decide(D(), P(), boom(), Decision("reject")).error
    assert raised is not None and raised.startswith("ValueError: boom\n\nTraceback")


def test_text_no_database_stores_is_escaped() -> None:
    s = decide(D(), P(), None, Decision("reject", reason="nul \x00 and \ud800"))
    assert s.error == "nul \\x00 and \\ud800"


def test_an_exception_whose_str_fails_is_named_all_the_same() -> None:
    class BrokenStr(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    s = decide(D(), P(retry=Retry.none()), BrokenStr())
    assert s.outcome is Outcome.FAIL and s.error is not None
    assert s.error.startswith("retries exhausted after 1 attempt(s): BrokenStr: <str()")


# ---- nack: the retry strategy decides ------------------------------------------------------

@pytest.mark.parametrize("raised", [False, True])
def test_a_nack_with_retries_left_is_retried_after_the_strategys_delay(raised: bool) -> None:
    s = decide(D(attempts=1, deliveries=2), P(), boom() if raised else None, Decision("nack"))
    assert (s.outcome, s.delay, s.attempted) == (Outcome.RETRY, 2.0, True)
    assert s.history is not None and s.history[-1]["delivery"] == 2


def test_a_nack_delay_overrides_the_strategys() -> None:
    s = decide(D(), P(), None, Decision("nack", delay=0.25))
    assert (s.outcome, s.delay) == (Outcome.RETRY, 0.25)
    zero = decide(D(), P(), None, Decision("nack", delay=0.0))
    assert (zero.outcome, zero.delay) == (Outcome.RETRY, 0.0)


@pytest.mark.parametrize(("raised", "history"), [(False, "nacked"), (True, "error")])
def test_retries_exhausted_fail_the_message(raised: bool, history: str) -> None:
    s = decide(D(attempts=2, deliveries=3), P(), boom() if raised else None, Decision("nack"))
    assert s.outcome is Outcome.FAIL and s.attempted
    assert s.error is not None and s.error.startswith("retries exhausted after 3 attempt(s): ")
    assert ended(s) == history


def test_retry_none_fails_at_the_first_nack_even_with_a_delay() -> None:
    s = decide(D(), P(retry=Retry.none()), None, Decision("nack", delay=5.0))
    assert s.outcome is Outcome.FAIL
    assert s.error == "retries exhausted after 1 attempt(s): nacked"


def test_a_strategy_is_asked_with_the_attempt_number_and_the_error() -> None:
    asked: list[tuple[int, BaseException | None]] = []

    def strategy(attempt: int, error: BaseException | None) -> timedelta:
        asked.append((attempt, error))
        return timedelta(minutes=1)

    error = boom()
    s = decide(D(attempts=4, deliveries=6), P(retry=strategy), error)
    assert asked == [(5, error)]
    assert (s.outcome, s.delay) == (Outcome.RETRY, 60.0)


@pytest.mark.parametrize("answer", [-1.0, MAX_DELAY * 2, float("nan"), "soon"])
def test_a_strategy_that_fails_or_answers_nonsense_fails_the_message(answer: Any) -> None:
    s = decide(D(), P(retry=lambda attempt, error: answer), boom())
    assert s.outcome is Outcome.FAIL and s.attempted
    assert s.error is not None and s.error.startswith("retry strategy failed (")
    assert "; last error: ValueError: boom" in s.error
    assert ended(s) == "error"


def test_the_history_keeps_its_newest_entries() -> None:
    old = [{"delivery": n, "ended": "lease_expired"} for n in range(1, HISTORY_LIMIT + 3)]
    s = decide(D(deliveries=HISTORY_LIMIT + 3, history=old), P(), boom())
    assert s.history is not None and len(s.history) == HISTORY_LIMIT
    assert s.history[-1]["delivery"] == HISTORY_LIMIT + 3
    assert s.history[:-1] == old[-(HISTORY_LIMIT - 1):]
    assert len(old) == HISTORY_LIMIT + 2  # decide never changes the delivery's own list


# ---- endings without a handler result -----------------------------------------------------

def test_an_undecodable_body_fails_without_counting_an_attempt() -> None:
    s = decide(D(), P(), DecodeError("body is not JSON"), ending=Ending.UNDECODABLE_BODY)
    assert (s.outcome, s.attempted, s.error) == (Outcome.FAIL, False,
                                                 "decode error: body is not JSON")
    assert ended(s) == "decode_error"


def test_an_undecodable_row_fails_with_its_defect_and_keeps_its_history() -> None:
    d = D(defect="undecodable row: headers are a JSON array, not an object \x00")
    assert unrunnable(d, P()) is Ending.UNDECODABLE_ROW
    s = decide(d, P(), ending=Ending.UNDECODABLE_ROW)
    assert (s.outcome, s.attempted, s.history) == (Outcome.FAIL, False, None)
    assert s.error == "undecodable row: headers are a JSON array, not an object \\x00"


@pytest.mark.parametrize(("limit", "deliveries", "over"),
                         [(3, 3, False), (3, 4, True), (None, 10_000, False), (1, 2, True)])
def test_max_deliveries_fails_a_delivery_over_the_limit_without_running_it(
    limit: int | None, deliveries: int, over: bool,
) -> None:
    d, p = D(deliveries=deliveries, attempts=0), P(max_deliveries=limit)
    assert exceeds_max_deliveries(d, p) is over
    assert unrunnable(d, p) is (Ending.MAX_DELIVERIES if over else None)
    if over:
        s = decide(d, p, ending=Ending.MAX_DELIVERIES)
        assert (s.outcome, s.attempted) == (Outcome.FAIL, False)
        assert s.error == f"max deliveries exceeded ({deliveries} > {limit})"
        assert ended(s) == "max_deliveries"


def test_a_defect_is_reported_before_max_deliveries() -> None:
    assert unrunnable(D(deliveries=99, defect="x"), P(max_deliveries=1)) is Ending.UNDECODABLE_ROW


NOON = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("expires_at", "expired"), [
    (None, False), (NOON + timedelta(microseconds=1), False), (NOON, True),
    (NOON - timedelta(days=1), True)])
def test_a_delivery_acquired_at_or_after_its_expiry_is_archived_expired_unrun(
    expires_at: datetime | None, expired: bool,
) -> None:
    """Expiry compares the acquire's time with the stored expiry, both the database's: a
    delivery acquired at the very moment of expiry is too late."""
    d = D(deliveries=2, attempts=1, acquired_at=NOON, expires_at=expires_at,
          history=[{"delivery": 1, "ended": "error"}])
    assert unrunnable(d, P()) is (Ending.EXPIRED if expired else None)
    if expired:
        s = decide(d, P(), ending=Ending.EXPIRED)
        assert (s.outcome, s.attempted, s.outcome.archives) == (Outcome.EXPIRE, False, True)
        assert s.error == f"expired at {expires_at.isoformat()} before it ran"  # type: ignore[union-attr]
        assert s.history is not None and len(s.history) == 2 and ended(s) == "expired"


def test_a_defect_goes_before_expiry_and_expiry_before_max_deliveries() -> None:
    """An undecodable row is reported as such; an expired message over the delivery limit
    was still never meant to run (EXPIRED, not a dead letter)."""
    past = NOON - timedelta(seconds=1)
    assert unrunnable(D(defect="x", expires_at=past), P()) is Ending.UNDECODABLE_ROW
    assert unrunnable(D(deliveries=99, expires_at=past), P(max_deliveries=1)) is Ending.EXPIRED


def test_an_unstarted_delivery_goes_back_with_its_delivery_refunded() -> None:
    s = decide(D(deliveries=3), P(), ending=Ending.UNSTARTED)
    assert s == Settlement(7, 3, Outcome.RELEASE, refund=True, attempted=False)


@pytest.mark.parametrize(("error", "reason"), [
    (RuntimeError("injected"), "sqlmq failed handling it: RuntimeError: injected"),
    (asyncio.CancelledError(), "its worker was cancelled"),
    (None, "its worker was cancelled"),
])
def test_an_abandoned_delivery_goes_back_after_a_pause_its_delivery_spent(
    error: BaseException | None, reason: str,
) -> None:
    s = decide(D(), P(), error, ending=Ending.ABANDONED)
    assert s == Settlement(7, 1, Outcome.RELEASE, error=reason, delay=ABANDON_DELAY,
                           attempted=False)


def test_a_delivery_cut_short_by_a_stop_goes_back_at_once() -> None:
    s = decide(D(), P(), ending=Ending.CUT_SHORT)
    assert s == Settlement(7, 1, Outcome.RELEASE, error="cancelled on shutdown",
                           attempted=False)


def test_every_ending_is_decided() -> None:
    for ending in Ending:
        s = decide(D(), P(), boom(), ending=ending)
        assert isinstance(s, Settlement) and s.id == 7


def test_only_complete_fail_expire_and_cancel_archive() -> None:
    assert {o for o in Outcome if o.archives} == {Outcome.COMPLETE, Outcome.FAIL,
                                                  Outcome.EXPIRE, Outcome.CANCEL}


# ---- defer and cancellation ----------------------------------------------------------------


def test_a_defer_is_neither_an_attempt_nor_a_failure() -> None:
    at = datetime(2026, 1, 1, 13, 0, tzinfo=UTC)
    s = decide(D(deliveries=3, attempts=1), P(), decision=Decision(
        "defer", delay=None, at=at, saved_state=b"x"))
    assert (s.outcome, s.attempted, s.at, s.saved_state, s.delay) == (
        Outcome.DEFER, False, at, b"x", 0.0)
    assert ended(s) == "deferred" and s.error is None
    # even after the handler raised: the defer it asked for wins, as ack and nack do
    assert decide(D(), P(), boom(), Decision("defer", delay=5.0)).outcome is Outcome.DEFER


def test_deliveries_that_ended_in_a_defer_do_not_count_against_max_deliveries() -> None:
    policy = P(max_deliveries=3)
    assert unrunnable(D(deliveries=1003, defers=1000), policy) is None
    assert not exceeds_max_deliveries(D(deliveries=1003, defers=1000), policy)
    assert unrunnable(D(deliveries=1004, defers=1000), policy) is Ending.MAX_DELIVERIES
    s = decide(D(deliveries=1004, defers=1000), policy, ending=Ending.MAX_DELIVERIES)
    assert "(4 > 3)" in (s.error or "")


def test_a_flagged_delivery_is_cancelled_unrun_and_unless_it_succeeds() -> None:
    flagged = D(cancel_requested=True)
    assert unrunnable(flagged, P()) is Ending.CANCELLED
    assert unrunnable(D(cancel_requested=True, defect="bad"), P()) is Ending.UNDECODABLE_ROW
    unrun = decide(flagged, P(), ending=Ending.CANCELLED)
    assert (unrun.outcome, unrun.attempted, ended(unrun)) == (Outcome.CANCEL, False, "cancelled")
    assert decide(flagged, P()).outcome is Outcome.COMPLETE  # it succeeded: completed
    assert decide(flagged, P(), decision=Decision("ack")).outcome is Outcome.COMPLETE
    failed = decide(flagged, P(), boom())
    assert failed.outcome is Outcome.CANCEL and "ValueError: boom" in (failed.error or "")
    for decision in (Decision("nack"), Decision("reject"), Decision("defer")):
        assert decide(flagged, P(), decision=decision).outcome is Outcome.CANCEL
    for ending in (Ending.UNSTARTED, Ending.CUT_SHORT, Ending.ABANDONED, Ending.EXPIRED):
        assert decide(flagged, P(), ending=ending).outcome is Outcome.CANCEL
