"""Retry strategies: their schedules as functions, and the same schedules in the rows.

``attempt`` is the number of the attempt that just failed (1 for the first); a strategy
answers the delay before the next one, or ``None`` when there is none.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from sqlmq import Broker, Message, Retry
from sqlmq.retry import delay_seconds

from .conftest import on_every_engine, rows, speed_up, wait_until

FAST = {"flush_interval": 0.01, "max_fetch_interval": 0.02}
# SQLite keeps milliseconds: two DB timestamps may each be rounded by half of one.
CLOCK_RESOLUTION = 0.002


def schedule(strategy: Callable[..., Any], attempts: int) -> list[Any]:
    return [strategy(n, ValueError("boom")) for n in range(1, attempts + 1)]


# ---- the strategies as functions ----------------------------------------------------------


def test_none_never_retries() -> None:
    assert schedule(Retry.none(), 3) == [None, None, None]


def test_constant_waits_the_same_until_max_attempts() -> None:
    assert schedule(Retry.constant(2.5, max_attempts=3), 4) == [2.5, 2.5, None, None]


def test_linear_grows_by_step_and_stops_at_max_delay() -> None:
    assert schedule(Retry.linear(1, 2, max_attempts=5), 5) == [1, 3, 5, 7, None]
    assert schedule(Retry.linear(1, 2, max_attempts=None, max_delay=4), 4) == [1, 3, 4, 4]


def test_exponential_without_jitter_multiplies_and_is_capped() -> None:
    strategy = Retry.exponential(1, 2, max_attempts=6, max_delay=5, jitter=0)
    assert schedule(strategy, 6) == [1, 2, 4, 5, 5, None]


def test_exponential_jitter_stays_within_its_fraction_of_the_capped_delay() -> None:
    strategy = Retry.exponential(1, 2, max_attempts=None, max_delay=5, jitter=0.1)
    third = [strategy(3, None) for _ in range(200)]  # 4 s ± 10 %
    capped = [strategy(10, None) for _ in range(200)]  # capped at 5 s, then ± 10 %
    assert all(3.6 <= d <= 4.4 for d in third)
    assert all(4.5 <= d <= 5.5 for d in capped)
    assert len(set(third)) > 1, "jitter must vary the delay"


def test_exponential_keeps_retrying_forever_without_overflowing() -> None:
    strategy = Retry.exponential(1, 2, max_attempts=None, max_delay=300, jitter=0)
    assert strategy(5000, None) == 300


def test_default_exponential_allows_five_attempts() -> None:
    strategy = Retry.exponential()
    assert all(d is not None for d in schedule(strategy, 4))
    assert strategy(5, None) is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: Retry.constant(1, max_attempts=0),
        lambda: Retry.linear(-1),
        lambda: Retry.exponential(jitter=1.5),
    ],
    ids=["max_attempts=0", "negative initial", "jitter>1"],
)
def test_invalid_strategy_parameters_are_refused(make: Callable[[], Retry]) -> None:
    with pytest.raises(ValueError):
        make()


def test_a_user_strategy_may_answer_seconds_a_timedelta_or_none() -> None:
    assert delay_seconds(lambda n, e: 3, 1, None) == 3.0
    assert delay_seconds(lambda n, e: timedelta(minutes=2), 1, None) == 120.0
    assert delay_seconds(lambda n, e: None, 1, None) is None
    with pytest.raises(ValueError, match="negative"):
        delay_seconds(lambda n, e: -1, 1, None)
    for beyond in (1e13, float("inf"), float("nan")):  # would break the settle batch in SQL
        with pytest.raises(ValueError, match="the limit is"):
            delay_seconds(lambda n, e, d=beyond: d, 1, None)


# ---- the schedules end to end -------------------------------------------------------------


class Recorder:
    """Wraps a strategy and keeps what it was asked and what it answered."""

    def __init__(self, strategy: Callable[..., Any]) -> None:
        self.strategy = strategy
        self.asked: list[tuple[int, str]] = []
        self.answers: list[float | None] = []

    def __call__(self, attempt: int, error: BaseException | None) -> Any:
        self.asked.append((attempt, type(error).__name__))
        answer = self.strategy(attempt, error)
        self.answers.append(delay_seconds(lambda *_: answer, attempt, error))
        return answer


END_TO_END = {
    "none": (Retry.none(), [None]),
    "constant": (Retry.constant(0.1, max_attempts=3), [0.1, 0.1, None]),
    "linear": (Retry.linear(0.05, 0.1, max_attempts=3), [0.05, 0.15, None]),
    "exponential capped with jitter": (
        Retry.exponential(0.05, 3, max_attempts=4, max_delay=0.2, jitter=0.25),
        [(0.0375, 0.0625), (0.1125, 0.1875), (0.15, 0.25), None],
    ),
    "callable seconds": (lambda n, e: 0.05 * n if n < 3 else None, [0.05, 0.1, None]),
    "callable timedelta": (
        lambda n, e: timedelta(milliseconds=100) if n < 2 else None, [0.1, None]
    ),
}


@on_every_engine
@pytest.mark.parametrize("name", list(END_TO_END))
async def test_failing_message_is_retried_on_schedule_until_retries_are_exhausted(
    broker: Broker, name: str
) -> None:
    speed_up(broker)  # on the in-memory engine, retry delays pass 10 times faster
    inner, expected = END_TO_END[name]
    strategy = Recorder(inner)
    waited: list[float] = []  # per redelivery: acquired_at - last_attempt_at, DB clock

    @broker.subscriber("q", retry=strategy, **FAST)
    async def handle(msg: Message) -> None:
        (row,) = await rows(broker, id=msg.id)
        if row["last_attempt_at"] is not None:
            waited.append((row["acquired_at"] - row["last_attempt_at"]).total_seconds())
        raise ValueError("boom")

    msg_id = await broker.publish("q", "x")
    await broker.start()
    try:
        await wait_until(lambda: rows(broker, "archive", id=msg_id), message="archived")
    finally:
        await broker.stop()

    attempts = len(expected)
    assert strategy.asked == [(n, "ValueError") for n in range(1, attempts + 1)]
    for answer, want in zip(strategy.answers, expected, strict=True):
        if want is None:
            assert answer is None
        elif isinstance(want, tuple):
            assert want[0] <= answer <= want[1]
        else:
            assert answer == pytest.approx(want)
    # never delivered before its retry was due
    assert len(waited) == attempts - 1
    for gap, delay in zip(waited, strategy.answers, strict=False):
        assert gap >= delay - CLOCK_RESOLUTION
    (row,) = await rows(broker, "archive", id=msg_id)
    assert row["state"] == "FAILED"
    assert row["attempts_count"] == attempts
    assert row["deliveries_count"] == attempts
    assert row["error"].split("\n\n", 1)[0] == (
        f"retries exhausted after {attempts} attempt(s): ValueError: boom")


@on_every_engine
async def test_each_strategy_schedules_the_retry_at_last_attempt_plus_its_delay(
    broker: Broker,
) -> None:
    strategies: dict[str, tuple[Any, float]] = {
        "constant": (Retry.constant(45), 45),
        "linear": (Retry.linear(30, 10), 30),
        "exponential": (Retry.exponential(100, max_delay=20, jitter=0), 20),  # the cap
        "callable": (lambda n, e: timedelta(seconds=40), 40),
    }
    for queue, (strategy, _) in strategies.items():

        @broker.subscriber(queue, retry=strategy, **FAST)
        async def handle(msg: Message) -> None:
            raise ValueError(f"boom in {msg.queue}")

    ids = {q: await broker.publish(q, "x") for q in strategies}

    async def all_retryable() -> bool:
        return all(r["state"] == "RETRYABLE" for r in await rows(broker)) and bool(
            await rows(broker)
        )

    await broker.start()
    try:
        await wait_until(all_retryable, message="every message retryable")
        now = await broker.engine.now()
    finally:
        await broker.stop()

    for queue, (_, delay) in strategies.items():
        (row,) = await rows(broker, id=ids[queue])
        assert row["state"] == "RETRYABLE"
        assert row["attempts_count"] == 1
        assert row["last_error"].split("\n\n", 1)[0] == f"ValueError: boom in {queue}"
        assert row["next_attempt_at"] > now
        gap = (row["next_attempt_at"] - row["last_attempt_at"]).total_seconds()
        assert gap == pytest.approx(delay, abs=CLOCK_RESOLUTION), queue


@on_every_engine
async def test_a_failing_strategy_archives_the_message_failed(broker: Broker) -> None:
    def broken(attempt: int, error: BaseException | None) -> float:
        raise RuntimeError("strategy bug")

    @broker.subscriber("q", retry=broken, **FAST)
    async def handle(msg: Message) -> None:
        raise ValueError("boom")

    msg_id = await broker.publish("q", "x")
    await broker.start()
    try:
        await wait_until(lambda: rows(broker, "archive", id=msg_id), message="archived")
    finally:
        await broker.stop()

    (row,) = await rows(broker, "archive", id=msg_id)
    assert row["state"] == "FAILED"
    assert "retry strategy failed (RuntimeError: strategy bug)" in row["error"]
    assert "ValueError: boom" in row["error"]
