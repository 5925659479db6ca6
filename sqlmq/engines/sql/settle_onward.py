"""Settling a pipeline step: the input archived and its output published in one transaction.

A subscriber with ``publish_to`` hands its handler's return value onward (see
:mod:`sqlmq.pipeline`): the runtime encodes it into the settlement's ``outputs``, and the
engine writes it here, in the transaction that settles the input. Either the input is
archived and the output exists, or neither: a crash (or a lost connection) between the
handler's return and the commit leaves the input to be delivered again and no output; a
commit whose reply was lost is found by ``landed`` like any other settle, and its outputs
with it. Fencing holds for the outputs too: the settle statements run first and write (and
lock) only the rows still held by the settling delivery, and an output is written only for
a settlement among those; a stale delivery's output is dropped with its result.

A settlement that keeps its handler's result, or whose ending a caller may wait for, takes
the same path on MariaDB and SQLite: the result is written on the archive row by
:mod:`sqlmq.engines.sql.results` in this transaction, after the settle statements and only
for the settlements they wrote, so it is fenced as the settle is. PostgreSQL's SETTLE
writes it in the statement that archives the message, with its NOTIFY
(``SETTLE_KEEPS_RESULTS``): its one-statement settle keeps serving such batches.

A DEFER or CANCEL settlement takes the same path: those are written by
:mod:`sqlmq.engines.sql.control`'s statements in the transaction that settles the rest.
So does a workflow's step: the steps waiting on the ones it ended are released or
cancelled by :mod:`sqlmq.engines.sql.workflows` in that transaction, after the settle
statements and only for the settlements they wrote.

The settle statements are each engine's own (:meth:`OnwardSettle._settle_in`, the same
statements as its one-transaction settle, in the given transaction); the outputs are
inserted with the engine's ``publish`` in that transaction (the outbox's path, NOTIFY
included), one insert per queue.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from ...new_messages import joined
from .control import CONTROL_OUTCOMES

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

    from ...records import NewMessages, Settlement

T = TypeVar("T")


class OnwardSettle:
    """The contract's ``settle`` for the SQL engines: the engine's fast settle for a batch
    without outputs (every flush of a plain subscriber), the transaction above otherwise."""

    if TYPE_CHECKING:
        db: AsyncEngine

        async def publish(self, messages: NewMessages,
                          executor: AsyncConnection | AsyncSession | None = None,
                          ) -> list[int]: ...

        async def _settle_control(self, conn: AsyncConnection,
                                  settlements: Sequence[Settlement]) -> set[int]:
            """The DEFER and CANCEL settlements (:mod:`sqlmq.engines.sql.control`)."""

        async def _keep_results(self, conn: AsyncConnection,
                                settlements: Sequence[Settlement], written: set[int]) -> None:
            """The results of the settlements written, and their announcement
            (:mod:`sqlmq.engines.sql.results`)."""

        async def _announce(self, conn: AsyncConnection, ids: Sequence[int]) -> None:
            """The announcement of endings ``ids`` (:mod:`sqlmq.engines.sql.results`)."""

        async def _steps_settled(self, conn: AsyncConnection,
                                 settlements: Sequence[Settlement]) -> None:
            """What the steps settled by ``settlements`` (written by this settle) that
            ended release or cancel (:mod:`sqlmq.engines.sql.workflows`)."""

    #: Whether the engine's own settle statements keep results and announce endings
    #: (PostgreSQL's SETTLE: in the statement that archives); else this transaction does.
    SETTLE_KEEPS_RESULTS = False

    async def settle(self, settlements: Sequence[Settlement]) -> set[int]:
        if needs_onward(settlements, results=not self.SETTLE_KEEPS_RESULTS):
            return await self._transaction(
                lambda conn: self._settle_onward(conn, settlements))
        return await self._settle_alone(settlements)

    async def _settle_onward(self, conn: AsyncConnection,
                             settlements: Sequence[Settlement]) -> set[int]:
        plain = [s for s in settlements if s.outcome not in CONTROL_OUTCOMES]
        written = await self._settle_in(conn, plain) if plain else set()
        if len(plain) < len(settlements):
            written |= await self._settle_control(
                conn, [s for s in settlements if s.outcome in CONTROL_OUTCOMES])
        for batch in outputs_of(settlements, written):
            await self.publish(batch, conn)
        if not self.SETTLE_KEEPS_RESULTS:
            await self._keep_results(conn, settlements, written)
        elif len(plain) < len(settlements):  # the control statements' endings
            await self._announce(conn, sorted(
                s.id for s in settlements
                if s.answers and s.outcome in CONTROL_OUTCOMES and s.id in written))
        steps = [s for s in settlements if s.step and s.id in written]
        if steps:
            await self._steps_settled(conn, steps)
        return written

    async def _settle_alone(self, settlements: Sequence[Settlement]) -> set[int]:
        """Settle ``settlements`` in a transaction of the engine's own: its hot path."""
        raise NotImplementedError

    async def _settle_in(self, conn: AsyncConnection,
                         settlements: Sequence[Settlement]) -> set[int]:
        """The same statements in ``conn``'s transaction, which the caller commits."""
        raise NotImplementedError

    async def _transaction(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``work`` in a transaction of its own, committed when it returns."""
        async with self.db.begin() as conn:
            return await work(conn)


def needs_onward(settlements: Sequence[Settlement], results: bool = True) -> bool:
    """Whether a batch takes the transaction above (outputs to publish, a DEFER or a
    CANCEL, a workflow's step, and with ``results`` a result to keep or an ending to
    announce) rather than an engine's one-statement settle."""
    return any(s.outputs is not None or s.outcome in CONTROL_OUTCOMES or s.step
               or (results and (s.answers or s.result is not None)) for s in settlements)


def outputs_of(settlements: Sequence[Settlement], written: set[int]) -> list[NewMessages]:
    """The outputs to publish with a settle that wrote ``written``: those of the settlements
    that landed, one batch per queue (:func:`~sqlmq.new_messages.joined`)."""
    return joined(s.outputs for s in settlements if s.outputs is not None and s.id in written)


__all__ = ["OnwardSettle", "needs_onward", "outputs_of"]
