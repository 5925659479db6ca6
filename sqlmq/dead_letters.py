"""Dead-letter events: every message archived FAILED or CANCELLED by this process is logged
as one WARNING line and handed to the broker's ``@broker.on_dead_letter`` hooks.

The event is raised after the database has accepted the result (a stale result, dropped
because another delivery owns the message, raises none), so a hook never hears of a dead
letter that is not in the archive. A hook may be a function or a coroutine function; a
coroutine runs as its own task. A hook that raises is logged with its traceback and the
others still run: a broken alert must not stop the runtime.

Those hooks hear of this process's dead letters. On PostgreSQL the database also announces
every dead letter, whichever process wrote it: the archiving statement sends a NOTIFY (see
:mod:`sqlmq.engines.postgresql.notify`), which an engine's ``dead_letter_source`` hears as a
:class:`DeadLetterNotice` (``sqlmq dlq watch`` follows it).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .lifecycle import Outcome, Settlement, State
from .records import Delivery

log = logging.getLogger("sqlmq")

#: The settle outcomes that make a dead letter.
DEAD_OUTCOMES = frozenset({Outcome.FAIL, Outcome.CANCEL})


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that ended without success: archived FAILED or CANCELLED."""

    id: int
    queue: str
    state: str
    #: Why: the last error (with its traceback) or the cancellation's reason.
    error: str | None
    deliveries: int
    headers: dict[str, str] = field(default_factory=dict)


DeadLetterHook = Callable[[DeadLetter], Any]


@dataclass(frozen=True, slots=True)
class DeadLetterNotice:
    """What a database pushes of a dead letter archived by any process (PostgreSQL's
    ``NOTIFY``, see :meth:`~sqlmq.engines.contract.Engine.dead_letter_source`): enough to
    look it up, never its body. The message may be gone already (a subscriber that keeps
    no dead letters, a requeue, a purge)."""

    id: int
    queue: str
    state: str


class DeadLetters:
    """The dead-letter hooks of one broker, and the WARNING line."""

    def __init__(self) -> None:
        self.hooks: list[DeadLetterHook] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    def settled(self, s: Settlement, d: Delivery | None) -> None:
        """``s`` landed with a dead outcome (FAIL or CANCEL)."""
        state = State.FAILED.value if s.outcome is Outcome.FAIL else State.CANCELLED.value
        self.report(DeadLetter(s.id, d.queue if d is not None else "?", state, s.error,
                               s.deliveries, dict(d.headers) if d is not None else {}))

    def report(self, dead: DeadLetter) -> None:
        reason = (dead.error or "").strip().splitlines()
        log.warning("dead letter: queue=%s id=%d state=%s deliveries=%d reason=%s",
                    dead.queue, dead.id, dead.state, dead.deliveries,
                    reason[-1] if reason else "none given")
        for hook in self.hooks:
            try:
                result = hook(dead)
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._tasks.add(task)
                    task.add_done_callback(lambda t, h=hook: self._ended(t, h, dead))
            except Exception:
                log.exception("the on_dead_letter hook %s failed for message %d",
                              _name(hook), dead.id)

    def _ended(self, task: asyncio.Task[Any], hook: DeadLetterHook, dead: DeadLetter) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("the on_dead_letter hook %s failed for message %d", _name(hook),
                      dead.id, exc_info=task.exception())

    async def drain(self) -> None:
        """Wait for the hooks still running (the broker's stop)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _name(hook: Any) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)


#: What a runtime built without a broker reports to: the log line only.
LOG_ONLY = DeadLetters()

__all__ = ["DEAD_OUTCOMES", "LOG_ONLY", "DeadLetter", "DeadLetterHook", "DeadLetterNotice",
           "DeadLetters"]
