"""``@broker.subscriber("orders", ...)``: a FastStream subscriber run by sqlmq's runtime.

The subscriber registers one plain sqlmq handler with the sqlmq broker underneath (with the
options given: workers, lease, retry, channels' limits hold, ``publish_to``, ...). sqlmq
fetches, leases, runs and settles as it does for any handler; the handler it runs is
FastStream's whole consume path: the middlewares, the parser, the filters, FastDepends
(annotation validation, ``Context()``, ``Depends()``, ``Logger``), the ack policy, and the
publishers that decorate the handler (RabbitMQ's, NATS', ... for a relay). What the ack
policy or the handler decided is sqlmq's decision; an exception reaches sqlmq too, so the
archive keeps its traceback and the retry strategy sees it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

from faststream._internal.configs import SubscriberSpecificationConfig
from faststream._internal.endpoint.publisher import PublisherUsecase
from faststream._internal.endpoint.subscriber import SubscriberSpecification, SubscriberUsecase
from faststream._internal.endpoint.subscriber.call_item import CallsCollection
from faststream.exceptions import FeatureNotSupportedException, StopConsume
from faststream.middlewares import AckPolicy
from faststream.specification.asyncapi.utils import resolve_payloads
from faststream.specification.schema import Message as SpecMessage
from faststream.specification.schema import Operation, SubscriberSpec

from sqlmq.lifecycle import AckPolicy as SqlmqAckPolicy

from .config import SqlmqBrokerConfig, SqlmqSubscriberConfig
from .message import SqlmqParser
from .producer import SqlmqReplyPublisher

if TYPE_CHECKING:
    from faststream._internal.endpoint.publisher import PublisherProto
    from faststream.message import StreamMessage

    from sqlmq import Broker, Message

#: FastStream's ack policy as sqlmq's, for what sqlmq decides itself: a handler that
#: returns without a decision under MANUAL (a nack, with a warning).
SQLMQ_POLICY = {
    AckPolicy.ACK_FIRST: SqlmqAckPolicy.ACK, AckPolicy.ACK: SqlmqAckPolicy.ACK,
    AckPolicy.REJECT_ON_ERROR: SqlmqAckPolicy.REJECT_ON_ERROR,
    AckPolicy.NACK_ON_ERROR: SqlmqAckPolicy.NACK_ON_ERROR,
    AckPolicy.MANUAL: SqlmqAckPolicy.MANUAL,
}


def faststream_policy(policy: AckPolicy | SqlmqAckPolicy | str | None) -> AckPolicy | None:
    """FastStream's ack policy from FastStream's, sqlmq's (same names) or its name."""
    if policy is None or isinstance(policy, AckPolicy):
        return policy
    return AckPolicy(str(policy).lower())


class SqlmqSubscriberSpecification(
    SubscriberSpecification[SqlmqBrokerConfig, SubscriberSpecificationConfig],
):
    """One AsyncAPI channel per queue the subscriber consumes, with the payload schema of
    its handlers' annotations."""

    def __init__(self, outer: SqlmqBrokerConfig, config: SubscriberSpecificationConfig,
                 calls: CallsCollection[Any], sub: SqlmqSubscriberConfig) -> None:
        super().__init__(outer, config, calls)
        self.sub = sub

    @property
    def channel_labels(self) -> list[str]:
        prefix = self._outer_config.prefix
        if self.sub.queues:
            return [f"{prefix}{q}" for q in self.sub.queues]
        return [f"{self.sub.group}@{t}" for t in self.sub.topic]

    def get_schema(self) -> dict[str, SubscriberSpec]:
        payload = resolve_payloads(self.get_payloads())
        labels = self.channel_labels
        schema = {}
        for label in labels:
            key = self._channel_key(label, split=len(labels) > 1)
            schema[key] = SubscriberSpec(
                address=label, description=self.description, bindings=None,
                operation=Operation(message=SpecMessage(title=f"{key}:Message",
                                                        payload=payload), bindings=None))
        return schema


class SqlmqSubscriber(SubscriberUsecase["Message"]):
    """A FastStream subscriber whose messages sqlmq fetches, runs and settles."""

    _outer_config: SqlmqBrokerConfig

    def __init__(self, config: SqlmqSubscriberConfig,
                 specification: SqlmqSubscriberSpecification,
                 calls: CallsCollection[Message]) -> None:
        parser = SqlmqParser()
        config.parser = parser.parse_message
        config.decoder = parser.decode_message
        super().__init__(config, specification, calls)
        self.config = config
        self._registered: Broker | None = None  # the sqlmq broker this one runs in
        self._handler: Callable[[Message], Any] | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        #: The publisher that documents a ``publish_to`` step's output queue (sqlmq's settle
        #: writes the outputs; this one only shows them in the AsyncAPI document).
        self.outputs: PublisherUsecase | None = None

    def __call__(self, func: Any = None, **kwargs: Any) -> Any:
        """Decorate a handler (FastStream's ``subscriber(...)(handler)``); a ``publish_to``
        step's return annotation becomes its output queue's payload schema."""
        decorated = super().__call__(func, **kwargs)
        if func is None:
            return lambda f: self._documented(decorated(f))
        return self._documented(decorated)

    def _documented(self, handler: Any) -> Any:
        if self.outputs is not None:
            self.outputs.specification.add_call(handler._declared_call)
        return handler

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues it consumes, with its routers' prefix."""
        prefix = self._outer_config.prefix
        return tuple(f"{prefix}{q}" for q in self.config.queues)

    async def start(self) -> None:
        """Build FastDepends' models, and register with the sqlmq broker, whose start
        (or, when it runs already, this call) starts the runtime."""
        await super().start()
        self._post_start()
        self._register(self._outer_config.sqlmq_broker())

    def _register(self, core: Broker) -> None:
        if self._registered is core:
            return
        self._handler = handler = self._sqlmq_handler()
        options = dict(self.config.options)
        if options.get("graceful_timeout") is None:
            options["graceful_timeout"] = self._outer_config.graceful_timeout or 30.0
        core.subscriber(self.queues or None, topic=self.config.topic or None,
                        group=self.config.group, ack_policy=SQLMQ_POLICY[self.ack_policy],
                        **options)(handler)
        self._registered = core

    def _sqlmq_handler(self) -> Callable[[Message], Any]:
        """The plain sqlmq handler that runs FastStream's consume path, named after the
        FastStream handler in sqlmq's logs and workers registry."""
        deliver = self._deliver

        async def handler(msg):  # type: ignore[no-untyped-def]  # sqlmq passes the Message
            return await deliver(msg)

        handler.__qualname__ = handler.__name__ = self.specification.call_name
        return handler

    async def _deliver(self, msg: Message) -> Any:
        """Run one delivery through FastStream; return what a ``publish_to`` step
        publishes onward. A subscriber stopped on its own (``StopConsume``) gives what
        sqlmq still hands it back untouched."""
        if not self.running:
            await msg.defer(1.0)
            return None
        try:
            result = await self.process_message(msg)
        except StopConsume:
            self._stop_soon()
            return None
        except SystemExit:
            self._stop_soon()
            if app := self._outer_config.context.get("app"):
                app.exit()
            return None
        return result.body

    def _stop_soon(self) -> None:
        """Stop this subscriber's sqlmq runtime from outside its own worker (a worker
        cannot wait for itself), once the current delivery is settled."""
        self.running = False
        core = self._registered
        for runtime in core.runtimes if core is not None else ():
            if runtime.adapter.handler is self._handler:
                task = asyncio.create_task(runtime.stop())
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)

    async def stop(self) -> None:
        await super().stop()
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)

    def _make_response_publisher(
            self, message: StreamMessage[Message]) -> Iterable[PublisherProto]:
        return (SqlmqReplyPublisher(self._outer_config.producer, message.reply_to),)

    async def get_one(self, *, timeout: float = 5  # noqa: ASYNC109
                      ) -> StreamMessage[Message] | None:
        raise FeatureNotSupportedException(
            "sqlmq subscribers are driven by sqlmq's runtime (leases, retries, channels): "
            "consume with a handler instead of get_one()")

    def __aiter__(self) -> AsyncIterator[StreamMessage[Message]]:
        raise FeatureNotSupportedException(
            "sqlmq subscribers are driven by sqlmq's runtime: consume with a handler")

    def get_log_context(self, message: StreamMessage[Message] | None) -> dict[str, str]:
        return {"queue": ",".join(self.queues or self.config.topic),
                "message_id": getattr(message, "message_id", "")}


def create_subscriber(*, config: SqlmqBrokerConfig, queues: tuple[str, ...],
                      topic: tuple[str, ...], group: str | None, options: dict[str, Any],
                      ack_policy: AckPolicy | None, no_reply: bool, title: str | None,
                      description: str | None, include_in_schema: bool) -> SqlmqSubscriber:
    sub_config = SqlmqSubscriberConfig(queues=queues, topic=topic, group=group,
                                       options=options, no_reply=no_reply,
                                       _outer_config=config)
    if ack_policy is not None:
        sub_config._ack_policy = ack_policy
    calls = CallsCollection[Any]()
    specification = SqlmqSubscriberSpecification(
        config, SubscriberSpecificationConfig(title_=title, description_=description,
                                              include_in_schema=include_in_schema),
        calls, sub_config)
    return SqlmqSubscriber(sub_config, specification, calls)
