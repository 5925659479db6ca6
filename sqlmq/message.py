"""The message a handler receives, and its manual settle calls."""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from .codec import CONTENT_TYPE, TOPIC_HEADER, decode, decode_state, encode_state
from .errors import AlreadySettled
from .lifecycle import Decision
from .records import Delivery
from .retry import MAX_DELAY

if TYPE_CHECKING:
    from .workflows.records import Dependency, Signal

#: The headers of a workflow's step (:mod:`sqlmq.workflows.records`, which imports what
#: imports this module).
_WORKFLOW_HEADER, _STEP_HEADER = "sqlmq-workflow", "sqlmq-step"
#: The longest signal name (a queue name's limit: the column's).
_MAX_NAME = 128

_UNSET: Any = object()
_KEEP: Any = object()  # defer(): keep the state saved before


class LeaseHandle(Protocol):
    """How a message reaches its lease without knowing the runtime: the subscriber's lease
    keeper. One handle serves every message it holds (the message names its delivery), so
    handing a message its lease costs nothing per message."""

    async def extend(self, delivery: Delivery, seconds: float) -> bool:
        """Push ``delivery``'s lease to now + ``seconds``; False if it was lost already."""
        ...

    async def dependencies(self, delivery: Delivery) -> list[Dependency]:
        """The dependencies of workflow step ``delivery`` as they ended."""
        ...

    async def received_signal(self, delivery: Delivery) -> Signal | None:
        """The signal ``delivery``'s message waited for, as that delivery reads it."""
        ...


class Message:
    """One delivery of a message. Settle it by returning (per the ack policy) or by hand
    with :meth:`ack`, :meth:`nack` or :meth:`reject`; the write is batched with others."""

    __slots__ = ("_body", "_decision", "_delivery", "_lease", "_state")

    def __init__(self, delivery: Delivery, lease: LeaseHandle | None = None) -> None:
        self._delivery = delivery
        self._lease = lease
        self._decision: Decision | None = None
        self._body: Any = _UNSET
        self._state: Any = _UNSET

    @property
    def id(self) -> int:
        return self._delivery.id

    @property
    def queue(self) -> str:
        return self._delivery.queue

    @property
    def payload(self) -> bytes:
        return self._delivery.payload

    @property
    def headers(self) -> dict[str, str]:
        return self._delivery.headers

    @property
    def content_type(self) -> str | None:
        return self._delivery.headers.get(CONTENT_TYPE)

    @property
    def topic(self) -> str | None:
        """The topic it was published to (None: published to its queue)."""
        return self._delivery.headers.get(TOPIC_HEADER)

    @property
    def body(self) -> Any:
        """The payload decoded by its content type (JSON, text, else bytes)."""
        if self._body is _UNSET:
            self._body = decode(self._delivery.payload, self.content_type)
        return self._body

    @property
    def attempts(self) -> int:
        """Attempts finished before this one."""
        return self._delivery.attempts

    @property
    def deliveries(self) -> int:
        """Deliveries so far, this one included."""
        return self._delivery.deliveries

    @property
    def created_at(self) -> datetime:
        return self._delivery.created_at

    @property
    def priority(self) -> int:
        """The priority it was published with (higher is taken first; 0 by default)."""
        return self._delivery.priority

    @property
    def expires_at(self) -> datetime | None:
        """When it expires (None: never); a handler only ever sees it before then, so a
        long handler can tell how much of its time is left."""
        return self._delivery.expires_at

    @property
    def history(self) -> list[dict[str, Any]]:
        """How earlier deliveries ended (newest last, bounded)."""
        return list(self._delivery.history)

    @property
    def state(self) -> Any:
        """What the handler saved with its last :meth:`defer` (None before the first)."""
        if self._state is _UNSET:
            self._state = decode_state(self._delivery.saved_state)
        return self._state

    @property
    def defers(self) -> int:
        """Deliveries of this message that ended in a :meth:`defer`."""
        return self._delivery.defers

    @property
    def channel(self) -> str | None:
        """The channel it was published to (None: none; see :meth:`Broker.set_channel`)."""
        return self._delivery.channel

    @property
    def cancel_requested(self) -> bool:
        """Whether ``Broker.cancel`` asked for this message while it runs. The handler may
        stop early: unless it succeeds, its result is archived CANCELLED and it does not
        run again. Seen at once in the process that cancels, within a third of the lease
        in others (the lease keeper reads it when it renews)."""
        return self._delivery.cancel_requested

    @property
    def decision(self) -> Decision | None:
        return self._decision

    def _decide(self, decision: Decision) -> None:
        if self._decision is not None:
            raise AlreadySettled(
                f"message {self.id} was already {self._decision.kind}ed in this delivery"
            )
        self._decision = decision

    # ack, nack and reject record the decision when called, and return an awaitable that is
    # already done: ``await msg.ack()`` in an async handler and a plain ``msg.ack()`` in a
    # sync one (run in a thread) both settle the message. The write itself is batched.

    def ack(self) -> Awaitable[None]:
        """Archive as COMPLETED."""
        self._decide(Decision("ack"))
        return _DONE

    def nack(self, delay: float | timedelta | None = None) -> Awaitable[None]:
        """Ask for a retry; the retry strategy decides whether one is left. ``delay``
        overrides the strategy's delay."""
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if delay is not None and delay < 0:
            raise ValueError(f"nack delay must not be negative, got {delay}")
        if delay is not None and not delay <= MAX_DELAY:
            raise ValueError(f"nack delay of {delay}s is over the limit of {MAX_DELAY:.0f}s")
        self._decide(Decision("nack", delay=delay))
        return _DONE

    def reject(self, reason: str | None = None) -> Awaitable[None]:
        """Archive as FAILED at once, with ``reason`` as the error."""
        self._decide(Decision("reject", reason=reason))
        return _DONE

    def defer(self, delay: float | timedelta | None = None, *, at: datetime | None = None,
              state: Any = _KEEP) -> Awaitable[None]:
        """Put the message back to wait until ``at`` (a timezone-aware time) or for
        ``delay`` (default: ready at once), saving ``state`` (bytes, str or a JSON value;
        the state saved before is kept if not given, ``None`` clears it) for its next
        delivery to read as :attr:`state`. Not a failure: the retry strategy's attempts do
        not count it, nor does ``max_deliveries``, so a long task can save its progress and
        yield as often as it likes."""
        if delay is not None and at is not None:
            raise ValueError("defer takes delay or at, not both")
        if at is not None and at.tzinfo is None:
            raise ValueError(f"naive datetime {at!r}: pass a timezone-aware datetime")
        return self._defer(delay, at, state, "defer delay")

    def _defer(self, delay: float | timedelta | None, at: datetime | None, state: Any,
               what: str, waits_for: str | None = None) -> Awaitable[None]:
        """The defer of :meth:`defer` and :meth:`wait_for` (``what`` names ``delay`` in
        the error of one out of range)."""
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if delay is not None and not 0 <= delay <= MAX_DELAY:
            raise ValueError(f"{what} must be between 0 and {MAX_DELAY:.0f}s, got {delay}")
        saved = self._delivery.saved_state if state is _KEEP else (
            None if state is None else encode_state(state))
        self._decide(Decision("defer", delay=delay, at=at, saved_state=saved,
                              waits_for=waits_for))
        return _DONE

    def wait_for(self, name: str, timeout: float | timedelta | None = None, *,
                 state: Any = _KEEP) -> Awaitable[None]:
        """Wait for signal ``name`` without holding a worker: the message is deferred (as
        :meth:`defer`, saving ``state``; not an attempt) until ``Broker.signal(msg.id,
        name, payload)`` comes or ``timeout`` (seconds or a timedelta; default: none)
        passes. Its next delivery reads ``await msg.signal()``. A signal that came before
        the wait (while the handler ran, or earlier) is taken at once: the message is due
        again as soon as this run settles."""
        if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
            raise ValueError(f"a signal's name is a non-empty str of at most {_MAX_NAME} "
                             f"characters, got {name!r}")
        return self._defer(MAX_DELAY if timeout is None else timeout, None, state,
                           "wait_for timeout", waits_for=name)

    async def signal(self) -> Signal | None:
        """What this message waited for with :meth:`wait_for` on its last run: the signal
        that came (``.name``, ``.payload``, ``.sent_at``), or one whose ``.timed_out`` is
        true if its timeout came first; None if it waited for nothing. One query."""
        if self._lease is None:
            raise RuntimeError("this message is not held by a running subscriber")
        return await self._lease.received_signal(self._delivery)

    async def extend(self, seconds: float) -> bool:
        """Push this delivery's lease to now + ``seconds``; False if it was lost already."""
        if self._lease is None:
            raise RuntimeError("this message is not held by a running subscriber")
        return await self._lease.extend(self._delivery, seconds)

    async def dependencies(self) -> dict[str, Dependency]:
        """The steps this workflow step waited for, by step name, each with its ending and
        its handler's result (``dep.result``, ``dep.ok``, ``dep.state``, ``dep.error``); empty
        for a message that is not a step or waited for nothing. Read when called: one query."""
        if _WORKFLOW_HEADER not in self._delivery.headers:
            return {}
        if self._lease is None:
            raise RuntimeError("this message is not held by a running subscriber")
        return {d.name: d for d in await self._lease.dependencies(self._delivery)}

    @property
    def workflow(self) -> str | None:
        """The workflow this message is a step of (None: none)."""
        return self._delivery.headers.get(_WORKFLOW_HEADER)

    @property
    def step(self) -> str | None:
        """Its step's name in its workflow (None: not a step)."""
        return self._delivery.headers.get(_STEP_HEADER)

    def __repr__(self) -> str:
        return (f"<Message id={self.id} queue={self.queue!r} deliveries={self.deliveries} "
                f"attempts={self.attempts}>")


class _Done:
    """An awaitable that is already complete (``await`` returns None at once); unlike a
    coroutine, nothing is lost, and no warning given, when a sync handler never awaits it."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield

    def __repr__(self) -> str:
        return "<settled>"


_DONE = _Done()
