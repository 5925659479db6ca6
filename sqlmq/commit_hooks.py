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

# target -> callbacks to run at its next commit, by key (one per broker and queue)
_pending: weakref.WeakKeyDictionary[Any, dict[Hashable, Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)


def on_commit(
    connection: Connection | Session | AsyncConnection | AsyncSession,
    key: Hashable, callback: Callable[[], None],
) -> None:
    """Run ``callback`` once when ``connection``'s current transaction commits; a second
    call with the same ``key`` before then is a no-op."""
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
            event.listen(target, "after_commit", _fire)
            event.listen(target, "after_rollback", _drop)
        else:
            event.listen(target, "commit", _fire)
            event.listen(target, "rollback", _drop)
    callbacks.setdefault(key, callback)


def _fire(target: Any) -> None:
    callbacks = _pending.get(target)
    if not callbacks:
        return
    todo = list(callbacks.values())
    callbacks.clear()
    for callback in todo:
        callback()


def _drop(target: Any) -> None:
    callbacks = _pending.get(target)
    if callbacks:
        callbacks.clear()
