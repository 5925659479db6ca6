"""``SqlmqRouter``: FastStream's router for sqlmq subscribers and publishers, included in an
:class:`~sqlmq.faststream.SqlmqBroker` (``broker.include_router(router)``), whose sqlmq
broker then runs them. ``prefix`` prefixes its queue names."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from faststream._internal.broker.router import ArgsContainer, BrokerRouter, SubscriberRoute
from faststream._internal.constants import EMPTY

from sqlmq import Message

from .config import SqlmqBrokerConfig
from .registrator import SqlmqRegistrator

if TYPE_CHECKING:
    from fast_depends.dependencies import Dependant
    from faststream._internal.types import BrokerMiddleware, CustomCallable
    from faststream.middlewares import AckPolicy



class SqlmqRoute(SubscriberRoute):
    """A handler and its ``subscriber`` arguments, for ``SqlmqRouter(handlers=[...])``."""

    def __init__(self, call: Callable[..., Any], queue: str, *,
                 publishers: Iterable[ArgsContainer] = (), **options: Any) -> None:
        super().__init__(call, queue, publishers=publishers, **options)


class SqlmqRouter(SqlmqRegistrator, BrokerRouter[Message, SqlmqBrokerConfig]):
    """Subscribers and publishers to include in an :class:`~sqlmq.faststream.SqlmqBroker`."""

    def __init__(
        self, prefix: str = "", handlers: Iterable[SqlmqRoute] = (), *,
        dependencies: Sequence[Dependant] = (),
        middlewares: Sequence[BrokerMiddleware[Any, Any]] = (),
        routers: Iterable[SqlmqRegistrator] = (), parser: CustomCallable | None = None,
        decoder: CustomCallable | None = None, include_in_schema: bool | None = None,
        ack_policy: AckPolicy = EMPTY,
    ) -> None:
        super().__init__(
            handlers=handlers, routers=routers,
            config=SqlmqBrokerConfig(
                prefix=prefix, ack_policy=ack_policy, broker_dependencies=dependencies,
                broker_middlewares=middlewares, broker_parser=parser, broker_decoder=decoder,
                include_in_schema=include_in_schema))
