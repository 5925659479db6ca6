"""Middleware: your code around publish and around handle, and the runtime's observation
points. Metrics (:mod:`sqlmq.metrics`) and tracing (:mod:`sqlmq.tracing`) are built on it.

::

    class Tenant(Middleware):
        def publish(self, batch: PublishBatch) -> None:
            batch.set_header("tenant", current_tenant())

        async def handle(self, msg: Message, call_next: CallNext) -> Any:
            with tenant_scope(msg.headers.get("tenant")):
                return await call_next(msg)

    broker = Broker(url, middleware=[Tenant()])     # or broker.add_middleware(Tenant())

Subclass :class:`Middleware` and override what you need (an object with some of its
methods works too); the methods left as they are cost nothing: with no middleware, or none
that overrides a hook, the hot path pays one truthiness check of an empty list.

* :meth:`Middleware.publish` sees every publish of the broker before it is written (``publish``,
  ``publish_batch``, the topic publishes, their ``_sync`` twins, in the caller's transaction
  or not, and a pipeline step's output), may add headers, and may return a context manager
  that wraps the write. It is synchronous, as it runs on every path, threads included.
* :meth:`Middleware.handle` wraps the handler call of one delivery: it sees the
  :class:`~sqlmq.Message`, the return value or the exception.
* :meth:`Middleware.handle_batch` wraps one call of a batch handler (``batch=``, see
  :mod:`sqlmq.runtime.batches`): it sees the list of messages the call handles, the
  list (or value) returned or the exception. ``handle`` never runs for a batch handler:
  one call serves every message of the batch, so there is no call of one message to wrap,
  and nesting a ``handle`` per message around it would leave each message's context (a
  tenant, a span) inside the others', the innermost one winning. A middleware that
  overrides ``handle`` and not ``handle_batch`` is named in a warning when a batch
  subscriber starts: it sees nothing of that subscriber's handling.
* :meth:`Middleware.settled`, :meth:`~Middleware.fetched`, :meth:`~Middleware.flushed` and
  :meth:`~Middleware.leases_extended` observe the runtime: a result written (or dropped as
  stale), an acquire, a settle flush, lease extensions. They must be quick and must not
  block: they run on the event loop, inside the runtime's loops.

Order: middleware runs in the order it was registered, the first one outermost (its
``publish`` context is entered first and left last, its ``handle`` calls the next one's,
and so does its ``handle_batch``).

Faults: an exception raised by a middleware's ``publish`` fails that publish with a
:class:`MiddlewareError` naming it (nothing is written); one raised while leaving its context
after the write is logged, never raised (the messages are written). One raised by its
``handle`` is the delivery's failure, as if the handler had raised it (the retry strategy
decides; nothing is lost), and is logged naming the middleware; one raised by its
``handle_batch`` is so for each message of the batch. One raised by an observation
point is logged and dropped.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from .errors import PublishError
from .lifecycle import Outcome, Settlement, error_text
from .message import Message
from .new_messages import NewMessages
from .records import Delivery
from .tracebacks import calls_user_code

if TYPE_CHECKING:
    from .records import QueueStats

__all__ = ["BrokerLike", "CallNext", "CallNextBatch", "Hooks", "Middleware", "MiddlewareError",
           "PublishBatch", "Settled"]

log = logging.getLogger("sqlmq")

#: What :meth:`Middleware.handle` calls to run the rest of the chain and the handler.
CallNext = Callable[[Message], Awaitable[Any]]
#: What :meth:`Middleware.handle_batch` calls to run the rest of the chain and a batch
#: handler, on the messages of the batch.
CallNextBatch = Callable[[list[Message]], Awaitable[Any]]


class BrokerLike(Protocol):
    """What the middleware's ``broker_started`` and ``broker_stopped`` hooks (and the
    metrics) are given: the :class:`~sqlmq.Broker` itself. A protocol of the parts they
    read, so that these modules, which the broker's runtime imports, need not import it."""

    metrics: Any

    @property
    def engine(self) -> Any: ...

    @property
    def runtimes(self) -> Sequence[Any]: ...

    @property
    def leading(self) -> bool: ...

    async def stats(self) -> list[QueueStats]: ...

    def add_middleware(self, middleware: object, *, first: bool = False) -> None: ...


class MiddlewareError(PublishError):
    """A middleware's ``publish`` hook raised: the publish wrote nothing. The middleware's
    own exception is the ``__cause__``."""


class PublishBatch:
    """The messages of one publish call, validated and encoded, about to be written.

    ``headers`` has one dict per message; messages of one content type share one dict, so
    :meth:`set_header` (every message) is one assignment per content type. To give one
    message a header of its own, replace its entry: ``batch.headers[i] = {**batch.headers[i],
    name: value}``. ``ids`` is set once the write returned (None before, and for a
    pipeline's output, which is written later with its input's result)."""

    __slots__ = ("cause", "connection", "ids", "messages", "topic")

    def __init__(self, messages: NewMessages, *, topic: str | None = None,
                 connection: Any = None, cause: Message | None = None) -> None:
        #: The messages as the engine will write them (queue, payloads, headers, schedule).
        self.messages = messages
        #: The topic of a topic publish (its copies go to each matching group's queue).
        self.topic = topic
        #: The caller's transaction (``connection=``: the outbox), or None.
        self.connection = connection
        #: The message whose handler returned these (a pipeline step's output), or None.
        self.cause = cause
        self.ids: Sequence[int] | None = None

    @property
    def queue(self) -> str | None:
        """The queue published to (None for a topic publish)."""
        return None if self.topic is not None else self.messages.queue

    @property
    def destination(self) -> str:
        """The queue, or the topic of a topic publish."""
        return self.topic if self.topic is not None else self.messages.queue

    @property
    def payloads(self) -> list[bytes]:
        return self.messages.payloads

    @property
    def headers(self) -> list[dict[str, str]]:
        return self.messages.headers

    def __len__(self) -> int:
        return len(self.messages)

    def set_header(self, name: str, value: str) -> None:
        """Set header ``name`` on every message of the batch (checked as a publish's headers
        are: non-empty ``str`` name, ``str`` value, no NUL)."""
        from .publishing import _headers

        _headers({name: value})  # raises PublishError naming the problem
        seen: set[int] = set()
        for h in self.messages.headers:
            if id(h) not in seen:
                seen.add(id(h))
                h[name] = value

    def __repr__(self) -> str:
        return f"<PublishBatch {self.destination!r} messages={len(self)}>"


@dataclass(frozen=True, slots=True)
class Settled:
    """A delivery's result, written (or dropped: ``stale``)."""

    settlement: Settlement
    #: The delivery it settles (None in the rare case the runtime no longer held it).
    delivery: Delivery | None
    #: The delivery was no longer ours (its lease expired and it was delivered again): the
    #: result was dropped, nothing was written.
    stale: bool = False

    @property
    def queue(self) -> str | None:
        return None if self.delivery is None else self.delivery.queue

    @property
    def outcome(self) -> Outcome:
        """What was written: COMPLETED, FAILED (dead-lettered), EXPIRED, CANCELLED (all
        archived), or RETRY, DEFER, RELEASE (back to the table)."""
        return self.settlement.outcome

    @property
    def created_at(self) -> datetime | None:
        """When the message was published (database time)."""
        return None if self.delivery is None else self.delivery.created_at


class Middleware:
    """Base class of middleware: every hook does nothing until overridden."""

    def publish(self, batch: PublishBatch) -> AbstractContextManager[Any] | None:
        """Called before ``batch`` is written, in the publishing thread; may change its
        headers. Return None, or a context manager: entered before the write, left after it
        (with the write's exception, if it failed; it cannot suppress it)."""
        return None

    async def handle(self, msg: Message, call_next: CallNext) -> Any:
        """Wrap the handling of one delivery: ``return await call_next(msg)`` runs the rest
        (the next middleware, then the handler) and returns the handler's value or raises
        its exception."""
        return await call_next(msg)

    async def handle_batch(self, msgs: list[Message], call_next: CallNextBatch) -> Any:
        """Wrap one call of a batch handler, which handles every message of ``msgs`` at
        once: ``return await call_next(msgs)`` runs the rest and returns the handler's value
        or raises its exception, which is then each message's failure. Pass ``msgs`` on as
        given (in order: a handler that keeps results returns them in it)."""
        return await call_next(msgs)

    def settled(self, event: Settled) -> None:
        """A result was written (or dropped as stale)."""

    def fetched(self, queues: Sequence[str], got: int, asked: int) -> None:
        """An acquire for a subscriber of ``queues`` asked for ``asked`` messages and got
        ``got``."""

    def flushed(self, queues: Sequence[str], size: int, limit: int, seconds: float) -> None:
        """A settle of ``size`` results (at most ``limit`` per flush) took ``seconds``."""

    def leases_extended(self, queues: Sequence[str], extended: int, lost: int) -> None:
        """A lease renewal (or ``msg.extend()``) extended ``extended`` leases and found
        ``lost`` lost."""

    async def broker_started(self, broker: BrokerLike) -> None:
        """The broker is starting (before its subscribers do)."""

    async def broker_stopped(self, broker: BrokerLike) -> None:
        """The broker stopped."""


def _observe(observers: Sequence[object], hook: str, *args: Any) -> None:
    """Call ``hook`` on each observer; one that raises is logged and the rest still run."""
    for m in observers:
        try:
            getattr(m, hook)(*args)
        except Exception as exc:
            _observer_failed(m, hook, exc)


def _name(m: object) -> str:
    return type(m).__qualname__.rsplit("<locals>.", 1)[-1]


def _overrides(m: object, hook: str) -> bool:
    """Whether ``m`` has its own ``hook`` (not the base class's do-nothing one)."""
    own = getattr(type(m), hook, None)
    return own is not None and own is not getattr(Middleware, hook)


class Hooks:
    """The registered middleware, sorted by hook: one list per hook holding only the
    middleware that overrides it, so a hook nobody uses is an empty list to the runtime."""

    __slots__ = ("fetch", "flush", "handle", "handle_batch", "lease", "lifecycle", "middleware",
                 "publish", "settle")

    def __init__(self, middleware: Iterable[object] = ()) -> None:
        self.middleware: list[object] = []
        self.publish: list[object] = []
        self.handle: list[object] = []
        self.handle_batch: list[object] = []
        self.settle: list[object] = []
        self.fetch: list[object] = []
        self.flush: list[object] = []
        self.lease: list[object] = []
        self.lifecycle: list[object] = []
        for m in middleware:
            self.add(m)

    def add(self, m: object, *, first: bool = False) -> None:
        """Register ``m`` (last, or with ``first`` outermost); registered already: nothing."""
        if any(x is m for x in self.middleware):
            return
        if first:
            self.middleware.insert(0, m)
        else:
            self.middleware.append(m)
        ms = self.middleware
        self.publish = [x for x in ms if _overrides(x, "publish")]
        self.handle = [x for x in ms if _overrides(x, "handle")]
        self.handle_batch = [x for x in ms if _overrides(x, "handle_batch")]
        self.settle = [x for x in ms if _overrides(x, "settled")]
        self.fetch = [x for x in ms if _overrides(x, "fetched")]
        self.flush = [x for x in ms if _overrides(x, "flushed")]
        self.lease = [x for x in ms if _overrides(x, "leases_extended")]
        self.lifecycle = [x for x in ms if _overrides(x, "broker_started")
                          or _overrides(x, "broker_stopped")]

    def __bool__(self) -> bool:
        return bool(self.middleware)

    # ---- publish -------------------------------------------------------------------------

    @contextmanager
    def around_publish(self, batch: PublishBatch) -> Iterator[PublishBatch]:
        """Run every ``publish`` hook, then the write (the ``with`` body), then leave the
        contexts they returned, innermost first."""
        entered: list[tuple[object, AbstractContextManager[Any]]] = []
        for m in self.publish:
            try:
                cm = m.publish(batch)  # type: ignore[attr-defined]
                if cm is not None:
                    cm.__enter__()
                    entered.append((m, cm))
            except Exception as exc:
                _leave(entered, exc, batch)
                raise MiddlewareError(
                    f"middleware {_name(m)} failed before publishing to "
                    f"{batch.destination!r}: {error_text(exc)}; nothing was published"
                ) from exc
        try:
            yield batch
        except BaseException as exc:
            _leave(entered, exc, batch)
            raise
        _leave(entered, None, batch)

    def publish_now(self, batch: PublishBatch) -> None:
        """Run the ``publish`` hooks for messages written later (a pipeline step's output,
        written with its input's result): their contexts are left at once."""
        with self.around_publish(batch):
            pass

    def publish_output(self, outputs: NewMessages, cause: Message,
                       context: contextvars.Context | None) -> None:
        """The ``publish`` hooks for a pipeline step's output (written later, with its
        input's result), in the context its handler ran in (inside the ``handle`` hooks',
        e.g. their span), when :func:`capture_context` kept it."""
        batch = PublishBatch(outputs, cause=cause)
        if context is None:
            self.publish_now(batch)
        else:
            context.run(self.publish_now, batch)

    # ---- handle --------------------------------------------------------------------------

    def wrap(self, call: CallNext) -> CallNext:
        """``call`` (a handler adapter) inside every ``handle`` hook, the first outermost."""
        for m in reversed(self.handle):
            call = _layer(m, "handle", call, _one)
        return call

    def wrap_batch(self, call: CallNextBatch) -> CallNextBatch:
        """``call`` (a batch handler's) inside every ``handle_batch`` hook, the first
        outermost."""
        for m in reversed(self.handle_batch):
            call = _layer(m, "handle_batch", call, _many)
        return call

    def unwrapped_by_batches(self) -> list[str]:
        """The middleware that wraps the handling of one message but not a batch's: it
        sees nothing of a batch handler's handling."""
        return [_name(m) for m in self.handle if m not in self.handle_batch]

    # ---- observation points ----------------------------------------------------------------

    def on_settled(self, event: Settled) -> None:
        _observe(self.settle, "settled", event)

    def on_fetched(self, queues: Sequence[str], got: int, asked: int) -> None:
        _observe(self.fetch, "fetched", queues, got, asked)

    def on_flushed(self, queues: Sequence[str], size: int, limit: int, seconds: float) -> None:
        _observe(self.flush, "flushed", queues, size, limit, seconds)

    def on_leases(self, queues: Sequence[str], extended: int, lost: int) -> None:
        _observe(self.lease, "leases_extended", queues, extended, lost)

    # ---- the broker's start and stop -----------------------------------------------------

    async def started(self, broker: BrokerLike) -> None:
        for m in self.lifecycle:
            hook = getattr(m, "broker_started", None)
            if hook is not None:
                await hook(broker)

    async def stopped(self, broker: BrokerLike) -> None:
        for m in reversed(self.lifecycle):
            hook = getattr(m, "broker_stopped", None)
            if hook is None:
                continue
            try:
                await hook(broker)
            except Exception as exc:
                _observer_failed(m, "broker_stopped", exc)


#: No middleware: what the runtime's services use when given none.
NO_HOOKS = Hooks()


def _leave(entered: list[tuple[object, AbstractContextManager[Any]]],
           exc: BaseException | None, batch: PublishBatch) -> None:
    """Leave the publish contexts entered, innermost first. A fault while leaving is logged:
    after a successful write the messages are published, and raising would tell the caller
    otherwise; after a failed one, the write's own exception is what the caller gets."""
    info = (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)
    while entered:
        m, cm = entered.pop()
        try:
            cm.__exit__(*info)
        except BaseException as fault:
            if fault is exc:
                continue
            log.error("middleware %s failed after publishing to %r (%s): %s", _name(m),
                      batch.destination, "the publish failed" if exc else "it was published",
                      error_text(fault), exc_info=fault)


def _layer(m: object, hook: str, inner: Callable[[Any], Awaitable[Any]],
           about: Callable[[Any], str]) -> Callable[[Any], Awaitable[Any]]:
    """``inner`` inside ``m``'s ``hook`` (``handle`` or ``handle_batch``); ``about`` names
    what it handles (a message, a batch) in the line that reports the hook's own fault."""
    handle = getattr(m, hook)
    name = _name(m)

    @calls_user_code
    async def call(handled: Any) -> Any:
        passed: list[BaseException] = []

        async def call_next(given: Any) -> Any:
            try:
                return await inner(given)
            except BaseException as exc:
                passed.append(exc)
                raise

        try:
            return await handle(handled, call_next)
        except Exception as exc:
            if not passed or exc is not passed[-1]:  # its own, not the handler's
                exc.add_note(f"raised by sqlmq middleware {name}.{hook}()")
                log.error("middleware %s raised %s in %s() for %s; the delivery fails as if "
                          "its handler had raised it", name, error_text(exc), hook,
                          about(handled))
            raise

    return call


def _one(msg: Message) -> str:
    return f"message {msg.id} of queue {msg.queue}"


def _many(msgs: list[Message]) -> str:
    queues = ", ".join(sorted({m.queue for m in msgs}))
    return f"a batch of {len(msgs)} messages of {queues} (each delivery fails)"


def capture_context(call: CallNext, box: dict[int, contextvars.Context]) -> CallNext:
    """``call``, saving the context it ran in (with every middleware's context variables
    set, e.g. the current span) under ``id(msg)``: a pipeline step's output is published in
    it, as if from inside the handler."""

    async def captured(msg: Message) -> Any:
        try:
            return await call(msg)
        finally:
            box[id(msg)] = contextvars.copy_context()

    return captured


def wrapped_batch(hooks: Hooks, call: Callable[[list[Any]], Awaitable[Any]],
                  msgs: list[Message], items: list[Any],
                  box: list[contextvars.Context] | None = None,
                  ) -> Callable[[], Awaitable[Any]]:
    """One call of a batch handler (``call``, on ``items``, made of ``msgs``) inside the
    ``handle_batch`` hooks, which see the messages; ``box`` receives the context the
    handler ran in (a pipeline's outputs are published in it, inside the hooks' spans)."""
    if not hooks.handle_batch:
        return lambda: call(items)
    item_of = {id(m): item for m, item in zip(msgs, items, strict=True)}

    async def handler(given: list[Message]) -> Any:
        try:
            chosen = [item_of[id(m)] for m in given]
        except (KeyError, TypeError):
            raise TypeError("a handle_batch hook called call_next() with messages that are "
                            "not its batch's: pass on the list it was given") from None
        try:
            return await call(chosen)
        finally:
            if box is not None:
                box.append(contextvars.copy_context())

    chain = hooks.wrap_batch(handler)
    return lambda: chain(msgs)


def _observer_failed(m: object, hook: str, exc: Exception) -> None:
    log.error("middleware %s failed in %s(): %s", _name(m), hook, error_text(exc),
              exc_info=exc)
