"""What a subscriber's runtime has done so far, for ``Broker`` insights and tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RuntimeCounters:
    acquired: int = 0
    #: Of those, started in the slot a result freed, by its settle (``engine.settle_passing``).
    passed: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    released: int = 0
    deferred: int = 0
    cancelled: int = 0
    #: Archived EXPIRED without running (acquired at or after their ``expires_at``).
    expired: int = 0
    stale: int = 0  # settlements dropped because the delivery was no longer ours
    lost_leases: int = 0
    #: Lease renewals that woke more than a third of a lease late (a blocked or starved loop).
    late_renewals: int = 0
    unwritable: int = 0  # results the database refused although it answered (see Flusher)
