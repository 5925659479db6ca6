"""Results on PostgreSQL (see :mod:`sqlmq.engines.sql.results`): SETTLE keeps a result in
the statement that archives its message, and announces the endings a caller may wait for
by a NOTIFY on the prefix's result channel, sent by that statement (or by the transaction
of a cancel), so it is delivered at the commit and never for a rollback or a stale result;
waiting callers LISTEN on it (:class:`~.notify.AnswerListener`) and read with ANSWERS,
straight on asyncpg as the hot path's statements are (through SQLAlchemy a read cost a
waiting caller more than the settle it waited for)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlalchemy import func, select, union_all
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Executable

from ...records import Answer
from ...schema import Schema
from ..contract import WakeSource
from ..sql.statements import render
from . import statements as sql
from .notify import AnswerListener, result_channel, result_payloads


class PgResults:
    """The NOTIFY and the LISTEN of endings for :class:`~.engine.PostgresEngine`."""

    schema: Schema
    db: AsyncEngine
    names: dict[str, object]
    _fetch: Callable[..., Awaitable[list[Any]]]

    @property
    def result_channel(self) -> str:
        """The channel of the endings callers may wait for (see :mod:`.notify`)."""
        return result_channel(self.schema)

    def _answer_statement(self, ids: Sequence[int]) -> Executable | None:
        """The NOTIFY of the endings ``ids`` (one per few hundred ids)."""
        notices = [select(func.pg_notify(self.result_channel, p))
                   for p in result_payloads(list(ids))]
        return notices[0] if len(notices) == 1 else union_all(*notices)

    @functools.cached_property
    def _answers_sql(self) -> str:
        return render(sql.ANSWERS, self.names)

    async def answers(self, ids: Sequence[int]) -> dict[int, Answer]:
        if not ids:
            return {}
        found: dict[int, Answer] = {}
        for msg_id, state, result, error, archived in await self._fetch(
                self._answers_sql, sorted({int(i) for i in ids})):
            if archived or msg_id not in found:
                found[msg_id] = Answer(state, None if result is None else bytes(result), error)
        return found

    def answer_source(self, on_ended: Callable[[list[int]], None],
                      on_connect: Callable[[], None]) -> WakeSource | None:
        """The LISTEN connection on this prefix's result channel."""
        return AnswerListener(self.db, self.result_channel, on_ended, on_connect)


__all__ = ["PgResults"]
