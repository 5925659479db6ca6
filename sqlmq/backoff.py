"""Retrying a loop's database work after a fault: exponential backoff with jitter, and one
log line per incident (when it starts and when it ends), not one per attempt."""

from __future__ import annotations

import asyncio
import logging
import random

from sqlalchemy.exc import DBAPIError

log = logging.getLogger("sqlmq")


def describe(exc: BaseException) -> str:
    """A one-line description. SQLAlchemy errors carry the SQL text, not the URL, so no
    password can leak through here."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300]


def unexpected(exc: BaseException) -> bool:
    """Whether a fault in a loop's database work deserves its traceback in the log: not a
    database error nor a lost connection or a timeout, which one line describes."""
    return not isinstance(exc, DBAPIError | OSError | TimeoutError | ConnectionError)


class FailureRun:
    """One log line when a repeated task starts failing and one when it succeeds again, none
    between: a task that fails every pass does not fill the log. The first failure's
    traceback is logged when it is not a database's or a lost connection's."""

    def __init__(self, what: str, tries: str = "tries") -> None:
        self.what = what
        self.tries = tries  # what the recovery line counts ("tries", "looks")
        self.failures = 0

    def note(self, exc: BaseException, then: str = "retrying with backoff") -> None:
        """A failure; ``then``: what happens next, for the first one's line."""
        if self.failures == 0:
            log.warning("%s failed (%s); %s", self.what, describe(exc), then,
                        exc_info=exc if unexpected(exc) else None)
        self.failures += 1

    def succeeded(self) -> None:
        if self.failures:
            log.warning("%s recovered after %d failed %s", self.what, self.failures,
                        self.tries)
            self.failures = 0


class Backoff(FailureRun):
    def __init__(self, what: str, base: float = 0.05, cap: float = 5.0) -> None:
        super().__init__(what)
        self.base = base
        self.cap = cap

    async def failed(self, exc: BaseException) -> None:
        self.note(exc)
        delay = min(self.cap, self.base * 2 ** min(self.failures - 1, 16))
        await asyncio.sleep(delay * random.uniform(0.5, 1.5))
