"""A subscriber's configuration and the adapter from a message to the handler's argument.

The handler's signature is checked when it is registered, so a handler sqlmq cannot call is
an error at import time, not a stream of failed messages later.
"""

from __future__ import annotations

import asyncio
import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .codec import decode
from .errors import ConfigurationError, DecodeError, HandlerSignatureError
from .message import Message
from .retry import Retry, RetryStrategy
from .schema import MAX_QUEUE_NAME
from .states import AckPolicy

Handler = Callable[..., Any]


def check_queue(queue: Any) -> str:
    if not isinstance(queue, str):
        raise ConfigurationError(f"queue name must be a str, got {type(queue).__name__}")
    if not queue:
        raise ConfigurationError("queue name must not be empty")
    if len(queue) > MAX_QUEUE_NAME:
        raise ConfigurationError(
            f"queue name is {len(queue)} characters long; the limit is {MAX_QUEUE_NAME}"
        )
    if "\x00" in queue:
        raise ConfigurationError("queue name must not contain NUL characters")
    if not queue.isascii():
        try:
            queue.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigurationError(
                f"queue name {queue!r} is not valid Unicode text (it has a lone surrogate)"
            ) from None
    return queue


@dataclass
class SubscriberConfig:
    """The knobs of one subscriber. Times are in seconds."""

    queues: tuple[str, ...]
    workers: int = 8
    fetch_batch: int = 100
    prefetch: int | None = None  # buffered, unstarted messages; default 2 × fetch_batch
    min_fetch_interval: float = 0.0
    max_fetch_interval: float = 1.0
    flush_interval: float = 0.05
    flush_batch: int = 500
    max_unflushed: int = 10_000
    lease: float = 30.0
    renew_leases: bool = True
    recovery_interval: float = 5.0  # how often expired leases are looked for
    max_deliveries: int | None = None
    retry: RetryStrategy = field(default_factory=Retry.exponential)
    ack_policy: AckPolicy = AckPolicy.NACK_ON_ERROR
    graceful_timeout: float = 30.0

    def __post_init__(self) -> None:
        if not self.queues:
            raise ConfigurationError("a subscriber needs at least one queue")
        self.queues = tuple(check_queue(q) for q in self.queues)
        for name in ("workers", "fetch_batch", "flush_batch", "max_unflushed"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be at least 1")
        if self.prefetch is None:
            self.prefetch = 2 * self.fetch_batch
        if self.prefetch < 1:
            raise ConfigurationError("prefetch must be at least 1")
        if self.lease <= 0:
            raise ConfigurationError("lease must be positive")
        if self.recovery_interval <= 0:
            raise ConfigurationError("recovery_interval must be positive")
        if self.min_fetch_interval < 0 or self.max_fetch_interval < self.min_fetch_interval:
            raise ConfigurationError("need 0 <= min_fetch_interval <= max_fetch_interval")
        if self.max_deliveries is not None and self.max_deliveries < 1:
            raise ConfigurationError("max_deliveries must be at least 1")
        self.ack_policy = AckPolicy(self.ack_policy)
        if not callable(self.retry):
            raise ConfigurationError("retry must be a Retry or a callable (attempt, error)")


class HandlerAdapter:
    """Calls the user's handler with what its one parameter asks for."""

    def __init__(self, handler: Handler) -> None:
        if not callable(handler):
            raise HandlerSignatureError(f"handler {handler!r} is not callable")
        self.handler = handler
        self.name = getattr(handler, "__qualname__", repr(handler))
        # A callable object counts as async when its __call__ is a coroutine function.
        call = None if inspect.isroutine(handler) else type(handler).__call__
        self.is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)
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
            hints = typing.get_type_hints(handler)
        except Exception:  # unresolvable forward references: fall back to raw annotations
            hints = {}
        annotation = hints.get(positional[0].name, positional[0].annotation)
        return _converter_for(annotation, self.name)

    async def __call__(self, message: Message) -> Any:
        argument = self.convert(message)
        if self.is_async:
            return await self.handler(argument)
        return await asyncio.to_thread(self.handler, argument)


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
    origin = typing.get_origin(annotation) or annotation
    if origin is types.UnionType:  # `dict | list`, the spelling of typing.Union since 3.10
        origin = typing.Union
    if origin in (dict, list, int, float, bool) or origin is typing.Union:

        def to_value(m: Message) -> Any:
            value = m.body
            if isinstance(origin, type) and not isinstance(value, origin):
                raise DecodeError(
                    f"body is {type(value).__name__}, handler {name} expects {origin.__name__}"
                )
            return value

        return to_value
    raise HandlerSignatureError(
        f"handler {name} asks for a {annotation!r}: sqlmq can pass Message, bytes, str, "
        "dict, list, a JSON scalar or a pydantic model"
    )


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


HandlerResult = Awaitable[Any] | Any
