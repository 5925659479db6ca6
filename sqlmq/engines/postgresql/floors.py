"""Floors under PostgreSQL's acquire: what earlier acquires proved taken, so that the next
one does not read it again.

While a session keeps a snapshot open (an idle transaction, a long report, a replica's
feedback), the ready-index entries of consumed messages cannot be removed, and an acquire
that reads a queue's index from its start checks every one of them against the table: its
cost grows with the messages consumed since the snapshot began (53 ms behind 300,000 in
``bench.dead_entries``, 0.45 ms above floors; pickup p50 at 500 ms after three minutes in
``bench.run held``, 39 ms above floors). So the engine keeps, per queue, the priority
levels it has seen and for each a floor on ``next_attempt_at`` below which every ready
message was taken (``ACQUIRE_ABOVE_FLOORS`` starts each level's range there and steps over
known levels instead of probing them).

A floor is a claim about rows acquire saw; two kinds of row can still become ready below
one:

* a message whose transaction began before the floor and committed after it (a publish
  stamps ``now()``, its transaction's start: an outbox publish in a long transaction);
* a message a concurrent acquire skipped while another session held its row lock, and that
  the lock's transaction then left ready (a rollback, a lost connection).

The first is covered for transactions up to :attr:`ReadyFloors.margin` long: a floor stays
that far behind what an acquire proved. For the rest, and for messages published with a
ready time already in the past, :data:`SWEEP_BELOW_FLOORS` looks below every floor every
:attr:`ReadyFloors.sweep_every` seconds (less often while sweeps are slow:
:data:`SWEEP_SPACING`), on another connection, and lowers a floor to what it finds: such a
message waits at most that long more. The sweep reads what a floorless acquire would, once
per interval instead of on every acquire, and never on the fetch loop's path.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...backoff import describe, unexpected

log = logging.getLogger("sqlmq")

# Positions in a row of ACQUIRE_ABOVE_FLOORS (see _TAKE in sqlmq.engines.postgresql.statements).
_ACQUIRED_AT, _READY_AT, _PRIORITY = 8, 10, 12

#: The levels a queue keeps floors for; a level beyond them is found by the gap probe on
#: every acquire, with no floor (as every level was before floors).
MAX_LEVELS = 32

#: A sweep that took ``d`` seconds is followed by the next one of its queue no sooner than
#: this many times ``d`` later (if that is longer than :attr:`ReadyFloors.sweep_every`), so
#: sweeping takes at most about a twentieth of a connection's time. Behind a held snapshot
#: the sweep reads every dead entry below the floors, more with each second of the hold:
#: 2,000 msg/s in ``bench.run held``, 35 ms a sweep 30 s into the hold, 355 ms after 190 s,
#: once a second (a third of a core, on a machine of two shared with the database's other
#: work). A message found only by the sweep then waits up to 20 times the sweep's length.
SWEEP_SPACING = 20.0

Sweep = Callable[[str, list[int], list[float]], Awaitable[Sequence[Any]]]


@dataclass
class _QueueFloors:
    floors: dict[int, float] = field(default_factory=dict)  # priority -> epoch seconds
    # Bumped when a sweep lowers a floor: an acquire that read the floors before then cannot
    # raise them (it did not read below the old ones).
    version: int = 0
    swept_at: float = field(default_factory=time.monotonic)
    sweep_took: float = 0.0  # seconds, the last sweep's
    sweeping: asyncio.Task[None] | None = None


class ReadyFloors:
    """Per queue, the priority levels acquire knows and each one's floor, learned from what
    acquires return and lowered by the sweep. One per engine; plain state on the event
    loop, no locks."""

    def __init__(self, margin: float = 1.0, sweep_every: float = 1.0) -> None:
        #: Seconds a floor stays behind the time an acquire proved: a publishing transaction
        #: that commits later than this after its start waits for the sweep.
        self.margin = margin
        #: Seconds between two sweeps of a queue, at least (see :data:`SWEEP_SPACING`).
        self.sweep_every = sweep_every
        self._queues: dict[str, _QueueFloors] = {}
        self._failed_sweeps = 0  # since the last sweep that worked, of any queue

    def args(self, queue: str) -> tuple[list[int], list[float], int]:
        """The known levels of ``queue``, their floors, and the version to learn with."""
        q = self._queues.get(queue)
        if q is None:
            return [], [], 0
        return list(q.floors), list(q.floors.values()), q.version

    def learn(self, queue: str, version: int, rows: Sequence[Any], limit: int) -> None:
        """Raise floors to what an acquire of up to ``limit`` rows proved. An acquire that
        came back short read every level's range up to its ``now()``. One that came back
        full read to the end every level above the lowest it took from; that lowest level's
        range it read only up to the first row it took (rows before it in the range were
        taken or locked by others)."""
        if not rows:
            return
        q = self._queues.setdefault(queue, _QueueFloors())
        if q.version != version:
            return
        now = rows[0][_ACQUIRED_AT]
        first: dict[int, float] = {}
        for r in rows:
            p, ready = r[_PRIORITY], r[_READY_AT]
            if ready < first.get(p, math.inf):
                first[p] = ready
        levels = {*q.floors, *first}
        if len(rows) < limit:
            proven = dict.fromkeys(levels, now)
        else:
            lowest = min(first)
            proven = {p: now for p in levels if p > lowest}
            proven[lowest] = first[lowest]
        for p, t in proven.items():
            if p in q.floors or len(q.floors) < MAX_LEVELS:
                q.floors[p] = max(q.floors.get(p, -math.inf), t - self.margin)

    def sweep_soon(self, queue: str, sweep: Sweep) -> None:
        """Start a sweep of ``queue`` in the background when one is due: not on the caller's
        path, at most one per queue at a time."""
        q = self._queues.get(queue)
        if q is None or q.sweeping is not None or not q.floors:
            return
        if time.monotonic() - q.swept_at < max(self.sweep_every, SWEEP_SPACING * q.sweep_took):
            return
        q.sweeping = asyncio.get_running_loop().create_task(
            self._sweep(queue, q, sweep), name=f"sqlmq sweep below floors of {queue!r}")

    async def _sweep(self, queue: str, q: _QueueFloors, sweep: Sweep) -> None:
        levels, floors = list(q.floors), list(q.floors.values())
        started = time.monotonic()
        try:
            found = await sweep(queue, levels, floors)
        except Exception as exc:  # not a cancellation: close() stops a sweep that way
            # The next acquire after sweep_every starts another; the floors stay as they are.
            # One line per incident, as the loops' Backoff logs: a lost connection is
            # described, anything but a database fault comes with its traceback.
            if not self._failed_sweeps:
                log.warning("the sweep below the acquire floors of queue %r failed (%s); it "
                            "runs again in %.1f s", queue, describe(exc), self.sweep_every,
                            exc_info=exc if unexpected(exc) else None)
            self._failed_sweeps += 1
        else:
            if self._failed_sweeps:
                log.warning("the sweep below the acquire floors recovered after %d failed "
                            "sweeps", self._failed_sweeps)
                self._failed_sweeps = 0
            self.lower(queue, found)
        finally:
            q.sweeping = None
            q.swept_at = time.monotonic()
            q.sweep_took = q.swept_at - started

    def lower(self, queue: str, found: Sequence[Any]) -> None:
        """Lower floors to the ready rows a sweep found below them: ``(priority, epoch
        seconds or None)`` pairs."""
        q = self._queues.get(queue)
        if q is None:
            return
        for p, ready in found:
            if ready is not None and ready < q.floors.get(p, -math.inf):
                q.floors[p] = ready
                q.version += 1

    async def close(self) -> None:
        """Stop the sweeps under way (the engine is closing)."""
        tasks = [q.sweeping for q in self._queues.values() if q.sweeping is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._queues.clear()
