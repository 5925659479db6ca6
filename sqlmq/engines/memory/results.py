"""The results half of the engine contract on the in-memory engine (see
:mod:`sqlmq.engines.sql.results`): the settle keeps a result on its archive row
(:meth:`~.engine.MemoryStore.settle`); here, the reads of waiting callers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ...records import Answer


class MemoryResults:
    """``answers``, ``answers_sync`` and ``answer_source`` for
    :class:`~.engine.MemoryEngine`."""

    _lock: threading.Lock
    _store: Any

    async def answers(self, ids: Sequence[int]) -> dict[int, Answer]:
        return self.answers_sync(ids)

    def answers_sync(self, ids: Sequence[int]) -> dict[int, Answer]:
        with self._lock:
            rows, archive = self._store.rows, self._store.archive
            found: dict[int, Answer] = {}
            for msg_id in ids:
                a = archive.get(msg_id)
                if a is not None:
                    found[msg_id] = Answer(a.state, a.result, a.error)
                elif msg_id in rows:
                    found[msg_id] = Answer(str(rows[msg_id].state))
            return found

    def answer_source(self, on_ended: Callable[[list[int]], None],
                      on_connect: Callable[[], None]) -> None:
        return None  # one process: its settles wake its waiters through the broker


__all__ = ["MemoryResults"]
