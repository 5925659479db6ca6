"""Duties done for everyone, the processes taking turns: recovery of expired leases and
periodic schedules (and, later, retention), and each running broker's heartbeat in the live
workers registry. Each runs beside a broker's subscribers and uses the contract only."""

from .heartbeat import Heartbeat
from .periodic import Ticker
from .recovery import LeaseRecovery

__all__ = ["Heartbeat", "LeaseRecovery", "Ticker"]
