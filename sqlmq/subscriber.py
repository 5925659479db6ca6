"""A subscriber's configuration and the adapter from a message to the handler's argument.

The handler's signature is checked when it is registered, so a handler sqlmq cannot call is
an error at import time, not a stream of failed messages later.
"""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .codec import decode
from .errors import ConfigurationError, DecodeError, HandlerSignatureError
from .lifecycle import AckPolicy, Archive
from .message import Message
from .retry import Retry, RetryStrategy
from .schema import DEFAULT_MAX_PAYLOAD, MAX_QUEUE_NAME
from .tracebacks import calls_user_code

Handler = Callable[..., Any]


def check_queue(queue: Any) -> str:
    return check_name(queue, "queue name")


def check_name(name: Any, what: str) -> str:
    """A queue name's rules, for any name stored in a queue-name column (a group, a
    schedule, a topic's words), its errors naming ``what``."""
    if not isinstance(name, str):
        raise ConfigurationError(f"{what} must be a str, got {type(name).__name__}")
    if not name:
        raise ConfigurationError(f"{what} must not be empty")
    if len(name) > MAX_QUEUE_NAME:
        raise ConfigurationError(
            f"{what} is {len(name)} characters long; the limit is {MAX_QUEUE_NAME}"
        )
    if "\x00" in name:
        raise ConfigurationError(f"{what} must not contain NUL characters")
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigurationError(
                f"{what} {name!r} is not valid Unicode text (it has a lone surrogate)"
            ) from None
    return name


@dataclass
class SubscriberConfig:
    """The knobs of one subscriber. Times are in seconds."""

    queues: tuple[str, ...]
    #: The consumer groups it joins, as (pattern, group): their queues are among ``queues``.
    groups: tuple[tuple[str, str], ...] = ()
    workers: int = 8
    fetch_batch: int = 1000  # the most one acquire asks for (see runtime.fetcher.FetchSize)
    prefetch: int | None = None  # buffered, unstarted messages; default 2 × fetch_batch
    min_fetch_interval: float = 0.0
    max_fetch_interval: float = 1.0
    flush_interval: float = 0.05
    flush_batch: int = 2000
    max_unflushed: int = 10_000
    lease: float = 30.0
    renew_leases: bool = True
    recovery_interval: float = 5.0  # how often expired leases are looked for
    #: Deliveries after which a message is archived FAILED without running again: what stops
    #: a message that kills its process (no result, so no retry strategy sees it). "auto"
    #: (the default) is :func:`default_max_deliveries`; None means no limit.
    max_deliveries: int | Literal["auto"] | None = "auto"
    retry: RetryStrategy = field(default_factory=Retry.exponential)
    ack_policy: AckPolicy = AckPolicy.NACK_ON_ERROR
    graceful_timeout: float = 30.0
    #: The queue a pipeline step publishes its handler's return value to, in the settle's
    #: transaction (see :mod:`sqlmq.pipeline`); None: the return value is ignored.
    publish_to: str | None = None
    #: The broker's limit, which the return values published onward are held to.
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD
    #: Which ended messages go to the archive; the others are deleted (see
    #: :class:`~sqlmq.lifecycle.Archive`).
    archive: Archive = Archive.ALL
    #: Keep the handler's return value on its message's archive row, for
    #: ``Broker.result`` and ``request`` (see :mod:`sqlmq.results`); a batch handler
    #: returns a list of one value per message.
    results: bool = False
    #: A batch handler: it receives a list of up to ``batch`` messages (see
    #: :mod:`sqlmq.runtime.batches`); None: one message per call.
    batch: int | None = None
    #: The longest a batch waits to fill, in seconds (default ``DEFAULT_BATCH_WAIT``);
    #: only with ``batch``.
    batch_wait: float | None = None

    def __post_init__(self) -> None:
        if not self.queues:
            raise ConfigurationError("a subscriber needs at least one queue (or topic= and "
                                     "group=)")
        self.queues = tuple(check_queue(q) for q in self.queues)
        if self.publish_to is not None:
            try:
                check_queue(self.publish_to)
            except ConfigurationError as exc:
                raise ConfigurationError(f"publish_to: {exc}") from None
        for name in ("workers", "fetch_batch", "flush_batch", "max_unflushed"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be at least 1")
        if self.prefetch is None:
            self.prefetch = 2 * self.fetch_batch
        if self.prefetch < 1:
            raise ConfigurationError("prefetch must be at least 1")
        if self.lease <= 0:
            raise ConfigurationError("lease must be positive")
        if self.flush_interval < 0:
            raise ConfigurationError("flush_interval must be 0 (write each result at once) or "
                                     "more")
        if self.recovery_interval <= 0:
            raise ConfigurationError("recovery_interval must be positive")
        if self.min_fetch_interval < 0 or self.max_fetch_interval < self.min_fetch_interval:
            raise ConfigurationError("need 0 <= min_fetch_interval <= max_fetch_interval")
        self.ack_policy = AckPolicy(self.ack_policy)
        try:
            self.archive = Archive(self.archive)
        except ValueError:
            raise ConfigurationError(f"archive must be 'all', 'failed' or 'none', got "
                                     f"{self.archive!r}") from None
        if not isinstance(self.results, bool):
            raise ConfigurationError(f"results must be True or False, got {self.results!r}")
        if self.results and self.archive is not Archive.ALL:
            raise ConfigurationError(
                f"results=True keeps each return value on its message's archive row, and "
                f"archive={self.archive.value!r} deletes completed messages: use "
                "archive='all' (the retention setting bounds how long results are kept)")
        if not callable(self.retry):
            raise ConfigurationError("retry must be a Retry or a callable (attempt, error)")
        self._check_batch()
        if self.max_deliveries == "auto":
            self.max_deliveries = default_max_deliveries(self.retry)
        if self.max_deliveries is not None and (
                not isinstance(self.max_deliveries, int) or isinstance(self.max_deliveries, bool)
                or self.max_deliveries < 1):
            raise ConfigurationError(
                f"max_deliveries must be at least 1, None (no limit) or 'auto', got "
                f"{self.max_deliveries!r}")


    def _check_batch(self) -> None:
        if self.batch is None:
            if self.batch_wait is not None:
                raise ConfigurationError("batch_wait needs batch= (the most messages a batch "
                                         "handler receives at once)")
            return
        if not isinstance(self.batch, int) or isinstance(self.batch, bool) or self.batch < 1:
            raise ConfigurationError(f"batch must be an int of at least 1, got {self.batch!r}")
        if self.batch_wait is None:
            self.batch_wait = DEFAULT_BATCH_WAIT
        if (not isinstance(self.batch_wait, (int, float)) or isinstance(self.batch_wait, bool)
                or not self.batch_wait >= 0):
            raise ConfigurationError(f"batch_wait must be 0 or more seconds, got "
                                     f"{self.batch_wait!r}")
        assert self.prefetch is not None
        if self.batch > self.prefetch:
            # The buffer never holds more than prefetch: such a batch could never fill.
            raise ConfigurationError(f"batch ({self.batch}) is over prefetch "
                                     f"({self.prefetch}): raise prefetch to at least batch")


#: How long a batch waits to fill by default: long enough for the next acquire to land.
DEFAULT_BATCH_WAIT = 0.1
#: The least ``max_deliveries`` defaults to.
DEFAULT_MAX_DELIVERIES = 10
#: Deliveries the default leaves beyond a retry strategy's ``max_attempts``: each delivery
#: beside a poison message may cost a neighbour one (at most two, see the quarantine in
#: :mod:`sqlmq.runtime.quarantine`), and a stop that cuts a handler short another.
DELIVERY_HEADROOM = 5


def default_max_deliveries(retry: RetryStrategy) -> int:
    """``max_attempts + DELIVERY_HEADROOM`` of a built-in :class:`Retry`, and at least
    ``DEFAULT_MAX_DELIVERIES``: retries are never cut short by it, while a message that
    kills its process every time stops after a bounded number of deliveries. A custom
    strategy, or one without ``max_attempts``, gets ``DEFAULT_MAX_DELIVERIES``: pass
    ``max_deliveries`` yourself (None for no limit) if it allows more attempts."""
    attempts = retry.max_attempts if isinstance(retry, Retry) else None
    if attempts is None:
        return DEFAULT_MAX_DELIVERIES
    return max(DEFAULT_MAX_DELIVERIES, attempts + DELIVERY_HEADROOM)


class HandlerAdapter:
    """Calls the user's handler with what its one parameter asks for."""

    def __init__(self, handler: Handler, batch: bool = False) -> None:
        if not callable(handler):
            raise HandlerSignatureError(f"handler {handler!r} is not callable")
        self.handler = handler
        self.name = getattr(handler, "__qualname__", repr(handler))
        # A callable object counts as async when its __call__ is a coroutine function.
        call = None if inspect.isroutine(handler) else type(handler).__call__
        self.is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)
        #: A batch handler takes a list: ``convert`` then makes one item of it.
        self.batch = batch
        self.convert = self._converter(handler)

    def _converter(self, handler: Handler) -> Callable[[Message], Any]:
        try:
            sig = inspect.signature(handler)
        except (TypeError, ValueError) as exc:
            raise HandlerSignatureError(f"cannot inspect handler {self.name}: {exc}") from None
        params = list(sig.parameters.values())
        required = [
            p for p in params
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(required) > 1 or any(p.kind is p.KEYWORD_ONLY for p in required):
            raise HandlerSignatureError(
                f"handler {self.name}{sig} must take exactly one positional argument "
                "(the message or its body); the others need defaults"
            )
        if not positional:
            raise HandlerSignatureError(
                f"handler {self.name}{sig} takes no positional argument: it must accept the "
                "message (annotate it Message) or its body (bytes, str, dict, a pydantic model)"
            )
        try:
            hints = typing.get_type_hints(handler, include_extras=True)  # keep Annotated
        except Exception:  # unresolvable forward references: fall back to raw annotations
            hints = {}
        annotation = hints.get(positional[0].name, positional[0].annotation)
        if self.batch:
            return _converter_for(_batch_item(annotation, self.name, sig), self.name)
        return _converter_for(annotation, self.name)

    @calls_user_code
    async def __call__(self, message: Message) -> Any:
        argument = self.convert(message)
        if self.is_async:
            return await self.handler(argument)
        return await asyncio.to_thread(self.handler, argument)

    @calls_user_code
    async def call_batch(self, items: list[Any]) -> Any:
        """A batch handler's call, on the items ``convert`` made of its messages."""
        if self.is_async:
            return await self.handler(items)
        return await asyncio.to_thread(self.handler, items)


_LISTS = (list, collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection)


def _batch_item(annotation: Any, name: str, sig: inspect.Signature) -> Any:
    """What each item of a batch handler's list is: ``list[X]`` (or a ``Sequence[X]``)
    gives X; a bare ``list``, or no annotation, gives the messages themselves."""
    if annotation in (inspect.Parameter.empty, Any) or annotation in _LISTS:
        return Message
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in _LISTS and len(args) == 1:
        return args[0]
    raise HandlerSignatureError(
        f"batch handler {name}{sig} must take a list: annotate it list[Message], "
        f"list[bytes], list[str] or list[Model], not {_type_name(annotation)}")


def _converter_for(annotation: Any, name: str) -> Callable[[Message], Any]:
    if annotation in (inspect.Parameter.empty, Message, Any):
        return lambda m: m
    if annotation is bytes:
        return lambda m: m.payload
    if annotation is str:
        return _text
    validate = getattr(annotation, "model_validate_json", None)
    if isinstance(annotation, type) and callable(validate):  # a pydantic model class

        def to_model(m: Message) -> Any:
            try:
                return validate(m.payload)
            except ValueError as exc:
                raise DecodeError(f"payload does not match {annotation.__name__}: {exc}") from None

        return to_model
    if _optional_message(annotation):
        return lambda m: m
    return _validated(annotation, name)


def _optional_message(annotation: Any) -> bool:
    """``Message | None`` or ``Optional[Message]``: the handler gets the message (never None)."""
    origin = typing.get_origin(annotation)
    if origin is not typing.Union and origin is not types.UnionType:
        return False
    args = set(typing.get_args(annotation))
    return Message in args and args <= {Message, type(None)}


def _validated(annotation: Any, name: str) -> Callable[[Message], Any]:
    """Any other annotation (``Model | None``, ``list[Model]``, ``float``, a TypedDict ...):
    the body, decoded by its content type, validated by pydantic's ``TypeAdapter`` in its
    default (lax) mode, as a bare model class is: JSON ``1`` is a valid ``float``, and, as
    in pydantic, ``true`` a valid ``int`` (annotate ``pydantic.StrictInt`` to refuse it)."""
    from pydantic import TypeAdapter, ValidationError  # here: importing it takes ~0.1 s
    from pydantic.errors import PydanticUserError

    try:
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
    except (PydanticUserError, TypeError, ValueError) as exc:
        raise HandlerSignatureError(
            f"handler {name} asks for a {annotation!r}: sqlmq can pass Message, bytes, str, or "
            f"the body as any type pydantic validates ({_first_line(exc)})"
        ) from None
    expected = _type_name(annotation)

    def to_value(m: Message) -> Any:
        value = m.body
        try:
            return adapter.validate_python(value)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:3]
            )
            raise DecodeError(f"body is {type(value).__name__}, handler {name} expects "
                              f"{expected}: {problems}") from None

    return to_value


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _first_line(exc: BaseException) -> str:
    return str(exc).split("\n", 1)[0]


def _text(m: Message) -> str:
    value = decode(m.payload, "text/plain")
    return value


@dataclass
class Subscriber:
    config: SubscriberConfig
    adapter: HandlerAdapter

    @property
    def queues(self) -> Sequence[str]:
        return self.config.queues

