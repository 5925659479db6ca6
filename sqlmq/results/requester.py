"""The broker's results and request/reply calls (a part of :class:`sqlmq.Broker`):
``result`` waits for a message to end and returns the value its subscriber kept,
``request`` publishes and waits in one call, each with its synchronous twin."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from .answers import value_of
from .keeping import AWAITED, AWAITED_HEADER
from .sync_wait import refuse_on_a_loop, wait_sync
from .watch import ResultWatch

if TYPE_CHECKING:
    from ..engines.contract import Engine

#: How long ``result`` and ``request`` wait by default (seconds).
DEFAULT_TIMEOUT = 30.0

#: When a message expires: seconds or a timedelta from the database's now, or a moment.
Expiry = float | timedelta | datetime


class Results:
    """Results and request/reply, for :class:`sqlmq.Broker` (which sets these attributes
    and has ``publish`` and ``publish_sync``)."""

    if TYPE_CHECKING:
        _engine: Engine
        _results: ResultWatch

        async def publish(self, queue: str, body: Any, **options: Any) -> int: ...

        def publish_sync(self, queue: str, body: Any, **options: Any) -> int: ...

    async def result(self, msg_id: int, *,
                     timeout: float | None = DEFAULT_TIMEOUT,  # noqa: ASYNC109 (FastStream's shape)
                     wait: bool = True) -> Any:
        """The value message ``msg_id``'s handler returned, once it is archived COMPLETED
        by a subscriber with ``results=True``; waits up to ``timeout`` seconds (None: no
        limit) for it to end, woken as soon as the ending commits. ``wait=False`` answers
        at once. Otherwise it raises, all :class:`~sqlmq.errors.ResultError`:
        :class:`~sqlmq.errors.MessageFailed` (with the archived ``error``),
        :class:`~sqlmq.errors.MessageCancelled`, :class:`~sqlmq.errors.MessageExpired`,
        :class:`~sqlmq.errors.NoResult` (completed, nothing kept),
        :class:`~sqlmq.errors.UnknownMessage`, or :class:`~sqlmq.errors.ResultTimeout` (not
        ended yet: it goes on, and its result can be read later)."""
        msg_id, timeout = _checked(msg_id, timeout if wait else 0)
        if timeout == 0:
            return value_of(msg_id, (await self._engine.answers([msg_id])).get(msg_id), None)
        return await self._outcome(msg_id, timeout)

    async def _outcome(self, msg_id: int, patience: float | None, fresh: bool = False) -> Any:
        """:meth:`result`'s wait (``fresh``: the message was published just now)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            found = await self._results.wait(msg_id, patience, fresh)
        except TimeoutError:
            # one last look: it may have ended as the time ran out
            found = (await self._engine.answers([msg_id])).get(msg_id)
        return value_of(msg_id, found, loop.time() - start)

    def result_sync(self, msg_id: int, *, timeout: float | None = DEFAULT_TIMEOUT,
                    wait: bool = True) -> Any:
        """The synchronous twin of :meth:`result`, for code without an event loop (it reads
        at intervals that grow with the wait: see :mod:`sqlmq.results.sync_wait`). Refused
        on a thread that runs an event loop, which it would block."""
        refuse_on_a_loop("result_sync()", "broker.result()")
        msg_id, timeout = _checked(msg_id, timeout if wait else 0)
        start = time.monotonic()
        found = wait_sync(self._engine, msg_id, timeout)
        return value_of(msg_id, found, None if timeout == 0 else time.monotonic() - start)

    async def request(
        self, queue: str, body: Any, *,
        timeout: float | None = DEFAULT_TIMEOUT,  # noqa: ASYNC109 (FastStream's shape)
        headers: Mapping[str, str] | None = None, priority: int = 0,
        expires: Expiry | None = None, dedup_key: str | None = None,
        channel: str | None = None,
    ) -> Any:
        """Publish ``body`` to ``queue`` and wait for its result (:meth:`result`), in one
        call: the value its handler returned, or the error saying how it ended otherwise.
        ``timeout`` covers both. The message carries the header ``awaited: result``, and
        the options are :meth:`~sqlmq.publisher.Publisher.publish`'s (give ``expires`` so
        that a request nobody took in time is not run after its caller gave up)."""
        _, timeout = _checked(0, timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        msg_id = await self.publish(
            queue, body, headers=_awaited(headers), priority=priority, expires=expires,
            dedup_key=dedup_key, channel=channel)
        left = None if deadline is None else max(deadline - loop.time(), 1e-6)
        return await self._outcome(msg_id, left, fresh=True)

    def request_sync(
        self, queue: str, body: Any, *, timeout: float | None = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None, priority: int = 0,
        expires: Expiry | None = None, dedup_key: str | None = None,
        channel: str | None = None,
    ) -> Any:
        """The synchronous twin of :meth:`request` (see :meth:`result_sync`)."""
        refuse_on_a_loop("request_sync()", "broker.request()")
        _, timeout = _checked(0, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        msg_id = self.publish_sync(
            queue, body, headers=_awaited(headers), priority=priority, expires=expires,
            dedup_key=dedup_key, channel=channel)
        left = None if deadline is None else max(deadline - time.monotonic(), 1e-6)
        return self.result_sync(msg_id, timeout=left)


def _checked(msg_id: Any, timeout: Any) -> tuple[int, float | None]:
    """A message id and a timeout as given, or a clear error naming the one at fault."""
    if isinstance(msg_id, bool) or not isinstance(msg_id, int):
        raise ConfigurationError(f"a message id is an int, got {type(msg_id).__name__} "
                                 f"{msg_id!r}")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or \
                math.isnan(timeout) or timeout < 0:
            raise ConfigurationError(f"timeout must be seconds (0 or more) or None (no "
                                     f"limit), got {timeout!r}")
        if math.isinf(timeout):
            timeout = None
    return int(msg_id), None if timeout is None else float(timeout)


def _awaited(headers: Mapping[str, str] | None) -> dict[str, str]:
    if headers is not None and not isinstance(headers, Mapping):
        raise ConfigurationError(f"headers must be a mapping of str to str, got "
                                 f"{type(headers).__name__}")
    return {**(headers or {}), AWAITED_HEADER: AWAITED}


__all__ = ["DEFAULT_TIMEOUT", "Results"]
