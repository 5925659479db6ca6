""":class:`SqlmqBroker`: a FastStream broker whose engine and runtime are sqlmq's.

It owns (or is given) an :class:`sqlmq.Broker`, reachable as :attr:`SqlmqBroker.core` for
what FastStream has no word for (channels' limits, cancel, pause, dead letters, schedules,
insights). Connecting checks (or, with ``migrate=True``, creates) the tables; starting
starts FastStream's subscribers, which register with the sqlmq broker, then the sqlmq
broker, whose runtime runs them; stopping stops sqlmq first, gracefully (unstarted
messages go back, running handlers finish), then FastStream's side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from fast_depends import dependency_provider
from faststream._internal.broker import BrokerUsecase
from faststream._internal.constants import EMPTY
from faststream._internal.context.repository import ContextRepo
from faststream._internal.di import FastDependsConfig
from faststream._internal.logger import DefaultLoggerStorage, make_logger_state
from faststream._internal.logger.logging import get_broker_logger
from faststream.response.publish_type import PublishType
from faststream.specification.schema import BrokerSpec

from sqlmq import Broker, Message
from sqlmq.schema import DEFAULT_MAX_PAYLOAD, DEFAULT_PREFIX

from .config import SqlmqBrokerConfig
from .message import SqlmqMessage
from .producer import SqlmqProducer, SqlmqPublishCommand
from .registrator import SqlmqRegistrator

if TYPE_CHECKING:
    from types import TracebackType

    from fast_depends import Provider
    from fast_depends.dependencies import Dependant
    from fast_depends.library.serializer import SerializerProto
    from faststream._internal.basic_types import LoggerProto
    from faststream._internal.context import ContextRepo as ContextRepoType
    from faststream._internal.parser import CodecProto
    from faststream._internal.types import BrokerMiddleware, CustomCallable
    from faststream.middlewares import AckPolicy
    from faststream.security import BaseSecurity
    from faststream.specification.schema.extra import Tag, TagDict
    from sqlalchemy import URL
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession



class SqlmqLoggerStorage(DefaultLoggerStorage):
    """FastStream's access log, with the queue in each line."""

    def __init__(self) -> None:
        super().__init__()
        self._width = 5

    def set_level(self, level: int) -> None:
        self.logger_log_level = level

    def register_subscriber(self, params: dict[str, Any]) -> None:
        self._width = max(self._width, len(params.get("queue", "")))

    def get_logger(self, *, context: ContextRepoType) -> LoggerProto:
        if not (lg := self._get_logger_ref()):
            lg = get_broker_logger(
                name="sqlmq", default_context={"queue": ""}, message_id_ln=10,
                fmt=("%(asctime)s %(levelname)-8s - "
                     f"%(queue)-{self._width}s | %(message_id)-10s - %(message)s"),
                context=context, log_level=self.logger_log_level)
            self._logger_ref.add(lg)
        return lg


def _core(target: Any, engine: Any, options: dict[str, Any]) -> Broker:
    if isinstance(target, Broker):
        return target
    if target is None and engine is None:
        raise TypeError("SqlmqBroker needs a database: a URL, an AsyncEngine or an "
                        "sqlmq Broker")
    return Broker(target if target is not None else engine, **options)


class SqlmqBroker(SqlmqRegistrator, BrokerUsecase[Message, Broker, SqlmqBrokerConfig]):
    """A FastStream broker on sqlmq: ``target`` is what :class:`sqlmq.Broker` takes (a URL
    such as ``postgresql://…``, ``sqlite:///app.db``, ``memory://``, or your
    ``AsyncEngine``), or an :class:`sqlmq.Broker` to share. ``engine`` is the same as an
    ``AsyncEngine`` target (faststream-sqlbroker's name). ``table_prefix``,
    ``max_payload_bytes`` and ``core_options`` (any other :class:`sqlmq.Broker` option)
    configure the sqlmq broker this one creates. ``migrate``: create or upgrade the tables
    when connecting (else they are checked). The other options are FastStream's."""

    def __init__(
        self, target: str | URL | AsyncEngine | Broker | None = None, *,
        engine: AsyncEngine | None = None, table_prefix: str = DEFAULT_PREFIX,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD, migrate: bool = False,
        core_options: dict[str, Any] | None = None, graceful_timeout: float | None = 15.0,
        ack_policy: AckPolicy = EMPTY, decoder: CustomCallable | None = None,
        parser: CustomCallable | None = None, codec: CodecProto | None = None,
        dependencies: Iterable[Dependant] = (),
        middlewares: Sequence[BrokerMiddleware[Any, Any]] = (),
        routers: Iterable[SqlmqRegistrator] = (), security: BaseSecurity | None = None,
        specification_url: str | Iterable[str] | None = None, protocol: str | None = None,
        protocol_version: str | None = "auto", description: str | None = None,
        tags: Iterable[Tag | TagDict] = (), logger: LoggerProto | None = EMPTY,
        log_level: int = logging.INFO, apply_types: bool = True,
        serializer: SerializerProto | None = EMPTY, provider: Provider | None = None,
        context: ContextRepo | None = None,
    ) -> None:
        core = _core(target, engine, {"table_prefix": table_prefix,
                                      "max_payload_bytes": max_payload_bytes,
                                      **(core_options or {})})
        config = SqlmqBrokerConfig(
            core=core, migrate=migrate, broker_middlewares=middlewares,
            broker_parser=parser, broker_decoder=decoder, broker_codec=codec,
            logger=make_logger_state(logger=logger, log_level=log_level,
                                     default_storage_cls=SqlmqLoggerStorage),
            fd_config=FastDependsConfig(
                use_fastdepends=apply_types, serializer=serializer,
                provider=provider or dependency_provider, context=context or ContextRepo()),
            broker_dependencies=dependencies, graceful_timeout=graceful_timeout,
            ack_policy=ack_policy, extra_context={"broker": self})
        config.producer = SqlmqProducer(config, parser, decoder)
        urls = ([specification_url] if isinstance(specification_url, str)
                else list(specification_url or [core.url]))
        super().__init__(
            config=config, routers=routers,
            specification=BrokerSpec(
                url=urls, protocol=protocol or urlparse(urls[0]).scheme or "sqlmq",
                protocol_version=protocol_version, description=description,
                security=security, tags=tags))

    @property
    def core(self) -> Broker:
        """The sqlmq broker underneath: channels, cancel, pause, dead letters, insights."""
        return self.config.broker_config.sqlmq_broker()

    async def _connect(self) -> Broker:
        return await self.config.broker_config.connect()

    async def start(self) -> None:
        """Connect, start FastStream's subscribers (each registers with the sqlmq broker),
        then the sqlmq broker, which runs them."""
        await self.connect()
        await super().start()
        await self.core.start()

    async def stop(self, exc_type: type[BaseException] | None = None,
                   exc_val: BaseException | None = None,
                   exc_tb: TracebackType | None = None) -> None:
        """Stop sqlmq gracefully first (its handlers are FastStream's consume path), then
        FastStream's subscribers; release the connections sqlmq opened."""
        await self.core.close()
        await super().stop(exc_type, exc_val, exc_tb)
        self._connection = None

    async def close(self) -> None:
        """:meth:`stop`, by sqlmq's name for it."""
        await self.stop()

    async def ping(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Whether the database answers (the tables' check), within ``timeout``."""
        try:
            await asyncio.wait_for(self.core.check_schema(), timeout)
        except Exception:
            return False
        return True

    async def publish(
        self, message: Any = None, queue: str = "", *,
        headers: dict[str, Any] | None = None, correlation_id: str | None = None,
        reply_to: str = "", delay: float | timedelta | None = None,
        at: datetime | None = None, next_attempt_at: datetime | None = None,
        priority: int = 0, expires: float | timedelta | datetime | None = None,
        dedup_key: str | None = None, channel: str | None = None,
        connection: AsyncConnection | AsyncSession | None = None,
    ) -> int:
        """Publish ``message`` to ``queue``; returns its sqlmq id. With ``connection`` (your
        ``AsyncSession`` or ``AsyncConnection``) it commits or rolls back with your
        transaction: the outbox. The other options are :meth:`sqlmq.Broker.publish`'s
        (``next_attempt_at`` is ``at``). FastStream's middlewares see it."""
        cmd = SqlmqPublishCommand(
            message, queue=queue, headers=headers,
            correlation_id=correlation_id or self.config.id_generator(), reply_to=reply_to,
            delay=delay, at=at or next_attempt_at, priority=priority, expires=expires,
            dedup_key=dedup_key, channel=channel, connection=connection)
        result: int = await self._basic_publish(cmd, producer=self.config.producer)
        return result

    async def publish_batch(  # type: ignore[override]
        self, *messages: Any, queue: str, headers: dict[str, Any] | None = None,
        correlation_id: str | None = None, delay: float | timedelta | None = None,
        at: datetime | None = None, next_attempt_at: datetime | None = None,
        priority: int = 0, expires: float | timedelta | datetime | None = None,
        dedup_keys: list[str | None] | None = None, channel: str | None = None,
        connection: AsyncConnection | AsyncSession | None = None,
    ) -> list[int]:
        """Publish many messages to ``queue`` at once; their ids in order."""
        if not messages:
            return []
        cmd = SqlmqPublishCommand(
            *messages, queue=queue, headers=headers,
            correlation_id=correlation_id or self.config.id_generator(), delay=delay,
            at=at or next_attempt_at, priority=priority, expires=expires,
            dedup_keys=dedup_keys, channel=channel, connection=connection)
        result: list[int] = await self._basic_publish_batch(cmd,
                                                            producer=self.config.producer)
        return result

    async def request(  # type: ignore[override]
        self, message: Any = None, queue: str = "", *,
        headers: dict[str, Any] | None = None, correlation_id: str | None = None,
        priority: int = 0, expires: float | timedelta | datetime | None = None,
        dedup_key: str | None = None, channel: str | None = None,
        timeout: float | None = 30.0,  # noqa: ASYNC109 (FastStream's shape)
    ) -> SqlmqMessage:
        """Publish ``message`` to ``queue`` and wait up to ``timeout`` seconds for the
        result its subscriber keeps (``results=True``), as :meth:`sqlmq.Broker.request`
        does; the answer is FastStream's response message (``body``, ``await
        response.decode()``). A failure raises sqlmq's :class:`~sqlmq.MessageFailed` (or
        ``MessageCancelled``, ``MessageExpired``, ``NoResult``); no answer in time,
        :class:`~sqlmq.ResultTimeout`, a ``TimeoutError``. FastStream's middlewares see
        both ways."""
        cmd = SqlmqPublishCommand(
            message, queue=queue, headers=headers,
            correlation_id=correlation_id or self.config.id_generator(), priority=priority,
            expires=expires, dedup_key=dedup_key, channel=channel, timeout=timeout,
            _publish_type=PublishType.REQUEST)
        response: SqlmqMessage = await self._basic_request(cmd, producer=self.config.producer)
        return response


__all__ = ["SqlmqBroker"]
