"""The message lifecycle, drawn once.

::

    PENDING ──acquire──▶ PROCESSING ──ack──────────────▶ COMPLETED (archive)
       ▲                    │  │ ──reject / no retries──▶ FAILED    (archive)
       │                    │  └──nack, retry allowed──▶ RETRYABLE ──acquire──▶ PROCESSING
       └──lease expired / released on stop──┘

PENDING, PROCESSING and RETRYABLE rows live in the message table; COMPLETED and FAILED
rows are moved to the archive in the same transaction that deletes them.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    RETRYABLE = "RETRYABLE"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


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


class Outcome(StrEnum):
    """What a flush writes for one delivery."""

    COMPLETE = "COMPLETED"  # archive as COMPLETED
    FAIL = "FAILED"  # archive as FAILED
    RETRY = "RETRY"  # back to the table as RETRYABLE, after a delay
    RELEASE = "RELEASE"  # back to PENDING now, no attempt counted (graceful stop)

    @property
    def archives(self) -> bool:
        return self in (Outcome.COMPLETE, Outcome.FAIL)
