"""The read-only views of the SQL engines, in SQLAlchemy Core (see :mod:`sqlmq.views`).

Nothing here writes or locks: every statement runs on a read-only connection. The archive
search is keyset-paginated on ``(archived_at, id)`` and filtered by the archive's
``(queue, archived_at)`` and ``(state, archived_at)`` indexes, so a page costs the same on
the first and the thousandth screen. A view of a row that sqlmq could not deliver (a hand
edit left its headers or history malformed) still shows, with the raw text in place of
the decoded value: an operator must be able to look at exactly the rows that broke.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, and_, case, func, literal, literal_column, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from ...lifecycle import State
from ...schema import Schema
from ...sqltime import db_now_plus, db_seconds_since
from ...views import ArchiveQuery, BucketCount, MessageView, WindowCount, bucket_index
from ...waits import Wait
from ..sqlite.connections import READ_ONLY
from .rows import RowDecodeError, decode_history, headers_of
from .waits import waits_of

_COUNTED = (State.COMPLETED, State.FAILED, State.CANCELLED, State.EXPIRED)


class ArchiveInsights:
    """``message_view``, ``search_archive``, ``search_archive_text``, ``archive_activity``,
    ``archive_buckets``, ``latency_sample`` and ``delivery_counts`` of the engine
    contract."""

    db: AsyncEngine
    schema: Schema

    async def _read(self, stmt: Any) -> list[Any]:
        async with self.db.connect() as conn:
            await conn.execution_options(**{READ_ONLY: True})
            return list(await conn.execute(stmt))

    async def message_view(self, msg_id: int) -> MessageView | None:
        m, a = self.schema.message, self.schema.archive
        live = await self._read(select(m, waits_of(m).label("waits"))
                                .where(m.c.id == msg_id))
        if live:
            return live_view(live[0])
        found = await self._read(select(a).where(a.c.id == msg_id))
        return _archived(found[0]) if found else None

    async def search_archive(self, query: ArchiveQuery) -> list[MessageView]:
        return [_archived(r) for r in await self._read(self.archive_search(query))]

    def archive_search(self, query: ArchiveQuery) -> Select[Any]:
        """The statement :meth:`search_archive` runs (the EXPLAIN test reads its plan)."""
        a = self.schema.archive
        stmt: Select[Any] = select(a).where(*archive_where(a, query))
        if query.after is not None:
            at, last_id = query.after
            stmt = stmt.where(or_(a.c.archived_at < at,
                                  and_(a.c.archived_at == at, a.c.id < last_id)))
        return stmt.order_by(a.c.archived_at.desc(), a.c.id.desc()).limit(query.limit)

    async def search_archive_text(self, words: Sequence[str], limit: int,
                                  before: int | None = None) -> list[MessageView]:
        return [_archived(r) for r in await self._read(
            self.archive_text_search(words, limit, before))]

    def archive_text_search(self, words: Sequence[str], limit: int,
                            before: int | None) -> Select[Any]:
        """The statement :meth:`search_archive_text` runs: each database's own, on the
        index it made at schema version 26 (see its ``search`` module)."""
        raise NotImplementedError

    async def archive_activity(self, windows: Sequence[float]) -> list[WindowCount]:
        a = self.schema.archive
        cuts = [db_now_plus(literal(-float(w))) for w in windows]
        columns: list[Any] = [a.c.queue, a.c.state]
        for cut in cuts:
            recent = a.c.archived_at >= cut
            columns.append(func.sum(case((recent, 1), else_=0)))
            columns.append(func.sum(case((and_(recent, a.c.deliveries_count > 1), 1),
                                         else_=0)))
        widest = cuts[max(range(len(windows)), key=lambda i: windows[i])]
        stmt = (select(*columns).where(a.c.archived_at >= widest,
                                       a.c.state.in_([s.value for s in _COUNTED]))
                .group_by(a.c.queue, a.c.state))
        counts: dict[tuple[str, float], dict[str, int]] = {}
        for row in await self._read(stmt):
            for i, window in enumerate(windows):
                c = counts.setdefault((row[0], window), {})
                c[row[1].lower()] = int(row[2 + 2 * i] or 0)
                c["retried"] = c.get("retried", 0) + int(row[3 + 2 * i] or 0)
        return [WindowCount(queue, window, **c) for (queue, window), c in sorted(counts.items())]

    async def archive_buckets(self, span: float, step: float,
                              queue: str | None = None) -> list[BucketCount]:
        a = self.schema.archive
        age = db_seconds_since(a.c.archived_at)
        bucket = func.floor(age / literal(float(step))).label("bucket")
        stmt = (select(a.c.queue, a.c.state, bucket, func.count(),
                       func.sum(case((a.c.deliveries_count > 1, 1), else_=0)))
                .where(a.c.archived_at >= db_now_plus(literal(-float(span))),
                       a.c.state.in_([s.value for s in _COUNTED]))
                .group_by(a.c.queue, a.c.state, literal_column("bucket")))
        if queue is not None:
            stmt = stmt.where(a.c.queue == queue)
        counts: dict[tuple[str, int], dict[str, int]] = {}
        for name, state, raw, n, retried in await self._read(stmt):
            index = bucket_index(float(raw), span, step)
            c = counts.setdefault((name, index), {})
            c[state.lower()] = c.get(state.lower(), 0) + int(n)
            c["retried"] = c.get("retried", 0) + int(retried or 0)
        return [BucketCount(name, index, **c) for (name, index), c in sorted(counts.items())]

    async def latency_sample(self, queue: str, window: float, limit: int) -> list[float]:
        a = self.schema.archive
        stmt = (select(a.c.created_at, a.c.archived_at)
                .where(a.c.queue == queue, a.c.archived_at >= db_now_plus(literal(-window)),
                       a.c.state == State.COMPLETED.value)
                .order_by(a.c.archived_at.desc()).limit(limit))
        return [max(0.0, (done - made).total_seconds())
                for made, done in await self._read(stmt)]

    async def delivery_counts(self, queue: str) -> dict[int, int]:
        m = self.schema.message
        stmt = (select(m.c.deliveries_count, func.count()).where(m.c.queue == queue)
                .group_by(m.c.deliveries_count))
        return {int(n): int(c) for n, c in await self._read(stmt)}


def archive_where(a: Any, query: ArchiveQuery) -> list[Any]:
    """The conditions of ``query``'s filters on archive table ``a`` (not its page: the
    search adds ``after``): what a search shows, a count counts and a requeue or purge
    ``matching`` it moves."""
    where: list[Any] = []
    if query.queue is not None:
        where.append(a.c.queue == query.queue)
    if query.states:
        where.append(a.c.state.in_(list(query.states)) if len(query.states) > 1
                     else a.c.state == query.states[0])
    if query.error_contains:
        where.append(a.c.error.contains(query.error_contains, autoescape=True))
    if query.archived_from is not None:
        where.append(a.c.archived_at >= query.archived_from)
    if query.archived_to is not None:
        where.append(a.c.archived_at < query.archived_to)
    return where


def live_view(r: Any) -> MessageView:
    """A row of the message table, read with what it waits on (:func:`.waits.waits_of`,
    labelled ``waits``)."""
    return MessageView(
        r.id, r.queue, r.state, _headers(r.headers), _payload(r.payload), r.priority,
        r.attempts_count, r.deliveries_count, r.created_at, None,
        r.next_attempt_at or r.channel_due_at, r.lease_expires_at, r.last_error,
        _history(r.history), r.channel, first_attempt_at=r.first_attempt_at,
        acquired_at=r.acquired_at if r.state == State.PROCESSING else None, waits=r.waits,
        waits_for=r.waits_for if r.waits == Wait.SIGNAL else None)


def _archived(r: Any) -> MessageView:
    return MessageView(r.id, r.queue, r.state, _headers(r.headers), _payload(r.payload),
                       r.priority, r.attempts_count, r.deliveries_count, r.created_at,
                       r.archived_at, None, None, r.error, _history(r.history), r.channel,
                       None if r.result is None else bytes(r.result),
                       first_attempt_at=r.first_attempt_at)


def _headers(value: Any) -> dict[str, str]:
    try:
        return dict(headers_of(value))
    except RowDecodeError as exc:
        return {"sqlmq-undecodable-headers": f"{exc}: {_text(value)}"}


def _history(value: Any) -> list[dict[str, Any]]:
    try:
        return list(decode_history(value))
    except RowDecodeError as exc:
        return [{"undecodable": f"{exc}: {_text(value)}"}]


def _payload(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return str(value).encode()  # a hand edit stored text or a number: show it as it is


def _text(value: Any) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else (
        value if isinstance(value, str) else json.dumps(value, default=str))
    return text[:200]


__all__ = ["ArchiveInsights", "archive_where", "live_view"]
