"""What the ending of some steps does to the steps that wait on them, worked out once for
every engine: the SQL engines and the in-memory one read the waiting steps and the edges,
ask :func:`next_level`, and write what it says, in the settle's transaction; the steps it
cancels end in turn, so they loop until a level ends nothing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..lifecycle import State
from .records import OnFailure


@dataclass(frozen=True, slots=True)
class Waiter:
    """A step still waiting: its id, how many of its dependencies have still to end, and
    what a failed one does to it."""

    id: int
    waiting: int
    on_failure: str


@dataclass(slots=True)
class Level:
    """``waiting``: the new count of each step that still waits; ``released``: the steps
    whose last dependency ended (published now); ``cancelled``: the steps a failed
    dependency cancels, with the reason."""

    waiting: dict[int, int] = field(default_factory=dict)
    released: list[int] = field(default_factory=list)
    cancelled: dict[int, str] = field(default_factory=dict)


def next_level(waiters: Iterable[Waiter], needs: Iterable[tuple[int, int]],
               ended: Mapping[int, str], names: Mapping[int, str]) -> Level:
    """The effect of the steps ``ended`` (id to final state; ``names`` names them) on
    ``waiters`` through the edges ``needs`` (``(step, dependency)``). A step whose
    dependency did not complete is cancelled unless it runs on failure; every other
    ending counts down its ``waiting``, and at zero it is released."""
    by_step: dict[int, list[int]] = {}
    for step, dependency in needs:
        if dependency in ended:
            by_step.setdefault(step, []).append(dependency)
    level = Level()
    for w in sorted(waiters, key=lambda w: w.id):
        deps = by_step.get(w.id)
        if not deps:
            continue
        failed = [d for d in sorted(deps) if ended[d] != State.COMPLETED]
        if failed and w.on_failure != OnFailure.RUN:
            d = failed[0]
            level.cancelled[w.id] = (f"cancelled: its dependency {names.get(d, d)!s} "
                                     f"(message {d}) ended {ended[d]}")
            continue
        left = w.waiting - len(deps)
        if left <= 0:
            level.released.append(w.id)
        else:
            level.waiting[w.id] = left
    return level


def revived_counts(cancelled: Mapping[int, str], needs: Mapping[int, list[int]],
                   ended: Mapping[int, str]) -> dict[int, int]:
    """Which of the steps ``cancelled`` by a failed dependency (id to its ``on_failure``)
    wait again now that a dependency of theirs was requeued, and for how many: ``needs``
    gives each step's dependencies, ``ended`` the final state of those in the archive (a
    dependency not there is waiting or running again). A step another failed dependency
    still holds back stays cancelled, unless it runs on failure."""
    out: dict[int, int] = {}
    for step, on_failure in cancelled.items():
        deps = needs.get(step, [])
        if on_failure != OnFailure.RUN and any(
                ended.get(d, State.COMPLETED) != State.COMPLETED for d in deps):
            continue
        left = sum(1 for d in deps if d not in ended)
        if left:
            out[step] = left
    return out


__all__ = ["Level", "Waiter", "next_level", "revived_counts"]
