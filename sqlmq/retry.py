"""Retry strategies: when a nacked message may run again, or ``None`` when it may not.

A strategy is any callable ``(attempt, error) -> seconds | timedelta | None`` where
``attempt`` is the number of the attempt that just failed (1 for the first).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

Delay = float | timedelta | None

#: The longest delay sqlmq schedules (100 years). Beyond it date arithmetic overflows in the
#: databases (MySQL's DATETIME ends in 9999, SQLite yields NULL) and one result would block
#: a whole settle batch.
MAX_DELAY = 100 * 365 * 24 * 3600.0
RetryStrategy = Callable[[int, BaseException | None], Delay]


@dataclass(frozen=True)
class Retry:
    """Built-in strategies. ``max_attempts`` counts every attempt, the first included."""

    kind: str
    max_attempts: int | None
    initial: float = 1.0
    step: float = 0.0
    multiplier: float = 2.0
    max_delay: float | None = None
    jitter: float = 0.0  # fraction of the delay, e.g. 0.1 = ±10 %

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        for name in ("initial", "step"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter is a fraction between 0 and 1, got {self.jitter}")

    @classmethod
    def none(cls) -> Retry:
        """Never retry: a nack archives the message FAILED."""
        return cls("none", 1)

    @classmethod
    def constant(cls, delay: float = 1.0, *, max_attempts: int | None = 5) -> Retry:
        return cls("constant", max_attempts, initial=delay)

    @classmethod
    def linear(
        cls, initial: float = 1.0, step: float = 1.0, *, max_attempts: int | None = 5,
        max_delay: float | None = None,
    ) -> Retry:
        return cls("linear", max_attempts, initial=initial, step=step, max_delay=max_delay)

    @classmethod
    def exponential(
        cls, initial: float = 1.0, multiplier: float = 2.0, *, max_attempts: int | None = 5,
        max_delay: float | None = 300.0, jitter: float = 0.1,
    ) -> Retry:
        return cls("exponential", max_attempts, initial=initial, multiplier=multiplier,
                   max_delay=max_delay, jitter=jitter)

    def __call__(self, attempt: int, error: BaseException | None = None) -> float | None:
        if self.kind == "none" or (self.max_attempts is not None and attempt >= self.max_attempts):
            return None
        if self.kind == "constant":
            delay = self.initial
        elif self.kind == "linear":
            delay = self.initial + self.step * (attempt - 1)
        else:
            try:
                delay = self.initial * self.multiplier ** (attempt - 1)
            except OverflowError:  # thousands of attempts with no max_attempts
                delay = math.inf
        if self.max_delay is not None:
            delay = min(delay, self.max_delay)
        if self.jitter:
            delay *= 1 + random.uniform(-self.jitter, self.jitter)
        return max(delay, 0.0)


def delay_seconds(
    strategy: RetryStrategy, attempt: int, error: BaseException | None
) -> float | None:
    """Ask a strategy and normalise its answer to seconds (``None`` = no more retries)."""
    delay = strategy(attempt, error)
    if delay is None:
        return None
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    if delay < 0:
        raise ValueError(f"retry strategy returned a negative delay ({delay}s)")
    if not delay <= MAX_DELAY:  # also NaN and inf: they would poison the settle batch
        raise ValueError(f"retry strategy returned a delay of {delay}s; the limit is "
                         f"{MAX_DELAY:.0f}s (100 years)")
    return float(delay)
