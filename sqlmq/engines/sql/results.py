"""Results on the SQL engines, in SQLAlchemy Core (schema version 22; see
:mod:`sqlmq.results`): a handler's return value kept on its message's archive row, and the
reads of callers waiting for a message to end.

A result is written by the transaction that archives its message (the onward settle of
:mod:`.settle_onward`), after the engine's settle statements, and only for the settlements
among those they wrote (PostgreSQL's SETTLE writes it in the statement that archives,
``SETTLE_KEEPS_RESULTS``): the settle is fenced on ``(id, deliveries, PROCESSING)``, so a
stale delivery's result is never kept, and a crash leaves both the archive row and its
result, or neither. The same transaction announces the endings a caller may wait for
(:meth:`ResultStatements._answer_statement`: PostgreSQL's NOTIFY, delivered at the
commit, never on rollback).

:meth:`answers` reads the message table and the archive in one statement: a snapshot in
which a message archived or requeued meanwhile shows on one side, never on neither (two
reads, one per table, could miss a message that moved between them).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, bindparam, literal, null, select, union_all, update
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable

from ...connect import READ_ONLY
from ...lifecycle import Outcome, Settlement
from ...records import Answer
from ...schema import Schema


class ResultStatements:
    """The results half of the engine contract for :class:`~.engine.SqlEngine`."""

    schema: Schema
    db: AsyncEngine
    sync_db: SyncEngine

    def _answer_statement(self, ids: Sequence[int]) -> Executable | None:
        """What tells waiting callers in other processes that messages ``ids`` ended, run
        in the transaction that ended them: PostgreSQL's NOTIFY; None where nothing is
        pushed (waiters poll, or watch the commit counter)."""
        return None

    async def _keep_results(self, conn: AsyncConnection, settlements: Sequence[Settlement],
                            written: set[int]) -> None:
        """In ``conn``'s transaction, after the settle statements wrote ``written``: the
        results of the COMPLETE settlements among them on their archive rows, and the
        announcement of those a caller may wait for."""
        kept = [(s.id, s.result) for s in settlements
                if s.result is not None and s.id in written and s.outcome is Outcome.COMPLETE]
        if kept:
            await self._write_results(conn, kept)
        told = sorted(s.id for s in settlements if s.answers and s.id in written)
        if told:
            await self._announce(conn, told)

    async def _write_results(self, conn: AsyncConnection,
                             kept: list[tuple[int, bytes]]) -> None:
        """Results ``kept`` (id, result) on their archive rows, in ``conn``'s transaction:
        an UPDATE per result (executemany)."""
        await conn.execute(_keep(self.schema.archive),
                           [{"p_id": i, "p_result": r} for i, r in kept])

    async def _announce(self, conn: AsyncConnection, ids: Sequence[int]) -> None:
        """Announce in ``conn``'s transaction that messages ``ids`` ended (see
        :meth:`_answer_statement`)."""
        statement = self._answer_statement(ids) if ids else None
        if statement is not None:
            await conn.execute(statement)

    async def answers(self, ids: Sequence[int]) -> dict[int, Answer]:
        found: dict[int, Answer] = {}
        a, m = self.schema.archive, self.schema.message
        async with self.db.connect() as conn:
            await conn.execution_options(**{READ_ONLY: True})
            for chunk in _chunks(ids):
                found.update(_decoded(await conn.execute(_answers(a, m, len(chunk)), chunk)))
        return found

    def answers_sync(self, ids: Sequence[int]) -> dict[int, Answer]:
        found: dict[int, Answer] = {}
        a, m = self.schema.archive, self.schema.message
        with self.sync_db.connect() as conn:
            conn = conn.execution_options(**{READ_ONLY: True})
            for chunk in _chunks(ids):
                found.update(_decoded(conn.execute(_answers(a, m, len(chunk)), chunk)))
        return found


#: The most ids one statement of :meth:`ResultStatements.answers` names; more are read in
#: as many statements as needed.
ANSWERS_AT_ONCE = 512


@functools.lru_cache(maxsize=64)
def _keep(a: Table) -> Any:
    """Result ``p_result`` on archive row ``p_id`` (run once per result: executemany)."""
    return update(a).where(a.c.id == bindparam("p_id")).values(
        result=bindparam("p_result", type_=a.c.result.type))


@functools.lru_cache(maxsize=64)
def _answers(a: Table, m: Table, n: int) -> Any:
    """Ids ``p_0`` … ``p_{n-1}`` in the archive (state, result, error) and in the message
    table (state), in one statement. Built once per size: a waiting caller's read repeats,
    and :func:`_chunks` makes every size a power of two."""
    params = [bindparam(f"p_{i}", type_=a.c.id.type) for i in range(n)]
    return union_all(
        select(a.c.id, a.c.state, a.c.result, a.c.error, literal(1).label("archived"))
        .where(a.c.id.in_(params)),
        select(m.c.id, m.c.state, null().label("result"), null().label("error"),
               literal(0).label("archived")).where(m.c.id.in_(params)),
    )


def _chunks(ids: Sequence[int]) -> list[dict[str, int]]:
    """The parameters of the statements that read ``ids``: at most ``ANSWERS_AT_ONCE`` a
    statement, each padded to a power of two by repeating its last id."""
    out = []
    unique = list(dict.fromkeys(int(i) for i in ids))
    for start in range(0, len(unique), ANSWERS_AT_ONCE):
        chunk = unique[start : start + ANSWERS_AT_ONCE]
        size = 1 << (len(chunk) - 1).bit_length()
        chunk += [chunk[-1]] * (size - len(chunk))
        out.append({f"p_{i}": msg_id for i, msg_id in enumerate(chunk)})
    return out


def _decoded(rows: Any) -> dict[int, Answer]:
    """The rows of :func:`_answers` by id; the archive's wins (a snapshot shows a message
    in one table only, but a hand-made copy could be in both)."""
    found: dict[int, Answer] = {}
    for msg_id, state, result, error, archived in rows:
        if archived or msg_id not in found:
            found[int(msg_id)] = Answer(state, None if result is None else bytes(result),
                                        error)
    return found


__all__ = ["ANSWERS_AT_ONCE", "ResultStatements"]
