"""Running a callback when the caller's transaction commits.

An outbox publish (``connection=``) is invisible until the caller commits, so waking this
process's subscribers at publish time would send them to find nothing. The wake-up waits
for the commit instead, and is dropped on rollback. A Session reports its commit after the
fact (``after_commit``); a Connection only just before the driver's COMMIT, so a subscriber
woken then may still miss the row, and the fetch loop polls again shortly after any wake-up
for that reason (see :mod:`sqlmq.runtime.fetcher`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

# target -> (callback at its next commit, callback if it rolls back instead), by key (one
# per broker and queue)
_Callbacks = tuple[Callable[[], None], Callable[[], None] | None]
_pending: weakref.WeakKeyDictionary[Any, dict[Hashable, _Callbacks]] = (
    weakref.WeakKeyDictionary()
)


def on_commit(
    connection: Connection | Session | AsyncConnection | AsyncSession,
    key: Hashable, callback: Callable[[], None],
    on_rollback: Callable[[], None] | None = None,
) -> None:
    """Run ``callback`` once when ``connection``'s outermost transaction commits, and forget
    it (running ``on_rollback``, if given) when that transaction rolls back or ends
    otherwise; a second call with the same ``key`` before then is a no-op. A Connection
    announces its commit just before the driver's COMMIT (there is no later event), a
    Session just after."""
    if isinstance(connection, AsyncSession):
        target: Any = connection.sync_session
    elif isinstance(connection, AsyncConnection):
        target = connection.sync_connection
    else:
        target = connection
    callbacks = _pending.get(target)
    if callbacks is None:
        callbacks = _pending[target] = {}
        if isinstance(target, Session):
            event.listen(target, "after_commit", _session_committed)
            event.listen(target, "after_transaction_end", _session_ended)
        else:
            event.listen(target, "commit", _fire)
            event.listen(target, "rollback", _drop)
    callbacks.setdefault(key, (callback, on_rollback))


def _fire(target: Any) -> None:
    callbacks = _pending.get(target)
    if not callbacks:
        return
    todo = list(callbacks.values())
    callbacks.clear()
    for callback, _ in todo:
        callback()


def _drop(target: Any) -> None:
    callbacks = _pending.get(target)
    if callbacks:
        todo = list(callbacks.values())
        callbacks.clear()
        for _, on_rollback in todo:
            if on_rollback is not None:
                on_rollback()


def _session_committed(session: Session) -> None:
    """A Session reports a savepoint's release as a commit too: wait for the outermost."""
    if not session.in_nested_transaction():
        _fire(session)


def _session_ended(session: Session, transaction: Any) -> None:
    """A Session's outermost transaction ended: after its commit nothing is left to run;
    otherwise it rolled back or was closed without a commit, and its callbacks are dropped."""
    if transaction.parent is None:
        _drop(session)
