"""Duties done for everyone, the processes taking turns: recovery of expired leases and
periodic schedules, each running broker's heartbeat in the live workers registry, and the
archive's retention, the forgetting of idle channels and of ended messages' signals (by
the registry's leader). Each
runs beside a broker's subscribers and uses the contract only."""

from .channel_rows import ChannelSweeper
from .heartbeat import Heartbeat
from .periodic import Ticker
from .recovery import LeaseRecovery
from .retention import ArchiveCleaner, Retention
from .signals import SignalSweeper

__all__ = ["ArchiveCleaner", "ChannelSweeper", "Heartbeat", "LeaseRecovery", "Retention",
           "SignalSweeper", "Ticker"]
