"""Duties one process at a time does for everyone: recovery of expired leases (and, later,
schedules and retention). Each runs beside a broker's subscribers and uses the contract only."""

from .recovery import LeaseRecovery

__all__ = ["LeaseRecovery"]
