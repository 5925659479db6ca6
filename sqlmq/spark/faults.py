"""Test-only fault injection for the stream's driver.

``SQLMQ_TEST_FAULT=<point>`` or ``<point>:<n>`` makes this process SIGKILL itself the n-th
time (default: the first) it passes the named point, so that crash tests can kill a driver
between any two statements of leasing, acknowledging and the sequence updates
(tests/spark/test_stream_faults.py). Read once at import; unset, as everywhere outside those
tests, a point costs one comparison.
"""

from __future__ import annotations

import os
import signal

FAULT = os.environ.get("SQLMQ_TEST_FAULT") or None
_hits: list[str] = []


def fault(point: str) -> None:
    """Die here if the crash test asked for it (see ``FAULT``)."""
    if FAULT is None or not FAULT.startswith(point):
        return
    nth = FAULT[len(point):]
    if nth not in ("", ":") and not (nth[0] == ":" and nth[1:].isdigit()):
        return  # another point whose name starts with this one's
    _hits.append(point)  # list.append is atomic: points are passed on two threads
    if len(_hits) == int(nth[1:] or 1):
        os.kill(os.getpid(), signal.SIGKILL)
