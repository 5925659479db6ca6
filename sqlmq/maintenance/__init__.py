"""Duties done for everyone, the processes taking turns: recovery of expired leases and
periodic schedules (and, later, retention). Each runs beside a broker's subscribers and
uses the contract only."""

from .periodic import Ticker
from .recovery import LeaseRecovery

__all__ = ["LeaseRecovery", "Ticker"]
