"""The UPDATEs that make a waiting step's message row what a publish writes (PENDING, due
after its delay or at its moment, a channel's message waiting apart with its turn): a
release's, and a workflow publish's for the steps that wait on nothing (:mod:`.steps`,
:mod:`.publishing`)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Float, Table, bindparam, case, update
from sqlalchemy.engine import Dialect

from ....lifecycle import State
from ....sqltime import db_now_plus
from ..lists import listed


@functools.lru_cache(maxsize=16)
def released_plain(m: Table, dialect: Dialect) -> Any:
    """The waiting steps ``p_ids`` without a channel made what a publish writes: PENDING,
    due after ``p_delay`` seconds."""
    return update(m).where(listed(dialect, m.c.id, "p_ids", "id"),
                           m.c.state == State.WAITING.value).values(
        state=State.PENDING.value,
        next_attempt_at=db_now_plus(bindparam("p_delay", type_=Float())))


def due_after_delays(m: Table, dialect: Dialect,
                      steps: list[tuple[int, float | None]]) -> list[tuple[Any, Any]]:
    """The statements that release the waiting steps ``steps`` (id, delay) without a
    channel or a moment: one per delay (one, mostly)."""
    by_delay: dict[float, list[int]] = {}
    for msg_id, delay in steps:
        by_delay.setdefault(float(delay or 0.0), []).append(msg_id)
    return [(released_plain(m, dialect), {"p_ids": ids, "p_delay": delay})
            for delay, ids in sorted(by_delay.items())]


@functools.lru_cache(maxsize=16)
def released_one(m: Table, at: bool) -> Any:
    """A waiting step's row made what a publish writes: PENDING, due at ``p_at`` (``at``)
    or after ``p_delay`` seconds, a channel's message waiting apart with its turn."""
    due = (bindparam("p_at", type_=m.c.next_attempt_at.type) if at
           else db_now_plus(bindparam("p_delay", type_=Float())))
    channel = bindparam("p_channel", type_=m.c.channel.type)
    return update(m).where(m.c.id == bindparam("p_id"), m.c.state == State.WAITING.value).values(
        state=State.PENDING.value, channel=channel,
        next_attempt_at=case((channel.is_(None), due)),
        channel_due_at=case((channel.is_not(None), due)),
        fair_key=bindparam("p_key", type_=m.c.fair_key.type),
        ordered=bindparam("p_ordered", type_=m.c.ordered.type))


__all__ = ["due_after_delays", "released_one", "released_plain"]
