"""The results half of the engine contract (:class:`~.contract.Engine` includes it): what
callers waiting for a message's ending read, and how they hear of it (see
:mod:`sqlmq.results`). The result itself is written by ``settle``, in its transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from ...records import Answer


class AnswerSource(Protocol):
    """Push notices of endings (PostgreSQL's LISTEN on the result channel), started by the
    first caller that waits and stopped when the broker closes."""

    #: Set while notices come (the connection listens): waiting callers then read only
    #: when told, and poll slowly in case one was lost.
    connected: asyncio.Event

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class ResultsContract(Protocol):
    """What ``Broker.result`` and ``request`` need of an engine."""

    async def answers(self, ids: Sequence[int]) -> dict[int, Answer]:
        """How each of ``ids`` stands now, read from the message table and the archive in
        one snapshot (a message that moved between them meanwhile shows on one side, never
        on neither): its state, and once archived its kept result and its error. An id in
        neither (never published, not committed yet, or deleted) is left out."""
        ...

    def answers_sync(self, ids: Sequence[int]) -> dict[int, Answer]:
        """The same, for code without an event loop."""
        ...

    def answer_source(self, on_ended: Callable[[list[int]], None],
                      on_connect: Callable[[], None]) -> AnswerSource | None:
        """A source of push notices of messages that ended with a caller perhaps waiting
        (settled with ``answers``, or cancelled while they waited), whichever process ended
        them, sent when that transaction commits: ``on_ended(ids)``, and ``on_connect()``
        after every (re)connect, when what was sent meanwhile is lost. None where the
        database has none (waiters poll, or watch ``Engine.commit_counter``)."""
        ...


__all__ = ["AnswerSource", "ResultsContract"]
