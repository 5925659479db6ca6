"""The live workers registry and paused queues on the in-memory engine (the SQL engines':
:mod:`..sql.operations`). Every method runs under the engine's lock, one transaction; the
acquire and the hand-over of a publish read :attr:`MemoryOperations._paused` there too
(see :class:`~.engine.MemoryStore`)."""

from __future__ import annotations

import copy
import threading
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from ...records import PausedQueue, WorkerBeat, WorkerInfo


class MemoryOperations:
    """The operations half of the engine contract for :class:`~.engine.MemoryEngine`."""

    _lock: threading.Lock
    _store: Any
    _writes: int
    _now: Any

    @property
    def _paused(self) -> dict[str, datetime]:
        return self._store.paused  # type: ignore[no-any-return]

    @property
    def _workers(self) -> dict[str, WorkerInfo]:
        return self._store.workers  # type: ignore[no-any-return]

    async def heartbeat(self, beat: WorkerBeat) -> int:
        with self._lock:
            now = self._now()
            found = self._workers.get(beat.id)
            self._workers[beat.id] = WorkerInfo(
                beat.id, beat.host, beat.pid, beat.version,
                now if found is None else found.started_at, now,
                now + timedelta(seconds=beat.ttl), copy.deepcopy(beat.subscribers),
                beat.running, beat.held)
            dead = [w.id for w in self._workers.values() if w.expires_at < now]
            for worker_id in dead:
                del self._workers[worker_id]
            return len(dead)

    async def leave(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)

    async def workers(self) -> list[WorkerInfo]:
        with self._lock:
            now = self._now()
            return [replace(w, subscribers=copy.deepcopy(w.subscribers))
                    for w in sorted(self._workers.values(),
                                    key=lambda w: (w.host, w.pid, w.started_at, w.id))
                    if w.expires_at > now]

    async def pause(self, queue: str) -> bool:
        with self._lock:
            if queue in self._paused:
                return False
            self._paused[queue] = self._now()
            return True

    async def resume(self, queue: str) -> bool:
        with self._lock:
            if self._paused.pop(queue, None) is None:
                return False
            self._writes += 1  # a change: idle subscribers look again
            return True

    async def paused(self) -> list[PausedQueue]:
        with self._lock:
            return [PausedQueue(q, at) for q, at in sorted(self._paused.items())]


__all__ = ["MemoryOperations"]
