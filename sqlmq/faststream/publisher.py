"""``@broker.publisher("invoices")``: a FastStream publisher of one sqlmq queue.

It decorates a handler (of any broker of the app) to publish its return value, or is
called directly; either way the write is sqlmq's, and ``connection=`` puts it in the
caller's transaction. Its AsyncAPI entry is a channel named after the queue, with the
payload schema of the decorated handlers' return annotation (or ``schema``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from faststream._internal.configs import PublisherSpecificationConfig, PublisherUsecaseConfig
from faststream._internal.endpoint.publisher import PublisherSpecification, PublisherUsecase
from faststream.response.publish_type import PublishType
from faststream.specification.asyncapi.utils import resolve_payloads
from faststream.specification.schema import Message, Operation, PublisherSpec

from .config import SqlmqBrokerConfig
from .message import SqlmqMessage
from .producer import SqlmqPublishCommand

if TYPE_CHECKING:
    from faststream._internal.types import PublisherMiddleware
    from faststream.response import PublishCommand
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession


@dataclass(kw_only=True)
class SqlmqPublisherConfig(PublisherUsecaseConfig):
    queue: str = ""
    headers: dict[str, str] | None = None
    #: sqlmq's publish options every message of this publisher gets (priority, channel, ...).
    options: dict[str, Any] | None = None


@dataclass(kw_only=True)
class SqlmqPublisherSpecificationConfig(PublisherSpecificationConfig):
    queue: str = ""


class SqlmqPublisherSpecification(
    PublisherSpecification[SqlmqBrokerConfig, SqlmqPublisherSpecificationConfig],
):
    @property
    def address(self) -> str:
        return f"{self._outer_config.prefix}{self.config.queue}"

    @property
    def name(self) -> str:
        return self.config.title_ or f"{self.address}:Publisher"

    def get_schema(self) -> dict[str, PublisherSpec]:
        payloads = self.get_payloads()
        return {
            self.name: PublisherSpec(
                address=self.address,
                description=self.config.description_,
                operation=Operation(
                    message=Message(title=f"{self.name}:Message",
                                    payload=resolve_payloads(payloads, "Publisher")),
                    bindings=None,
                ),
                bindings=None,
            ),
        }


class SqlmqPublisher(PublisherUsecase):
    """A publisher of one sqlmq queue (or of the queue each call names)."""

    _outer_config: SqlmqBrokerConfig

    def __init__(self, config: SqlmqPublisherConfig,
                 specification: SqlmqPublisherSpecification) -> None:
        super().__init__(config, specification)
        self.config = config
        self.headers = config.headers or {}
        self.options = config.options or {}

    @property
    def queue(self) -> str:
        return f"{self._outer_config.prefix}{self.config.queue}"

    def _command(self, messages: tuple[Any, ...], queue: str | None,
                 headers: dict[str, Any] | None, **options: Any) -> SqlmqPublishCommand:
        merged = {**self.options, **{k: v for k, v in options.items() if v is not None}}
        if merged.get("priority") is None:
            merged["priority"] = 0
        return SqlmqPublishCommand(*messages, queue=queue or self.queue,
                                   headers=self.headers | (headers or {}), **merged)

    async def publish(
        self, message: Any = None, queue: str | None = None, *,
        headers: dict[str, Any] | None = None, correlation_id: str | None = None,
        reply_to: str = "", delay: float | timedelta | None = None,
        at: datetime | None = None, next_attempt_at: datetime | None = None,
        priority: int | None = None, expires: float | timedelta | datetime | None = None,
        dedup_key: str | None = None, channel: str | None = None,
        connection: AsyncConnection | AsyncSession | None = None,
    ) -> int:
        """Publish one message (to ``queue``, else this publisher's); returns its sqlmq id.
        The options are :meth:`sqlmq.Broker.publish`'s; ``next_attempt_at`` is ``at``."""
        cmd = self._command(
            (message,), queue, headers, correlation_id=correlation_id
            or self._outer_config.id_generator(), reply_to=reply_to, delay=delay,
            at=at or next_attempt_at, priority=priority, expires=expires,
            dedup_key=dedup_key, channel=channel, connection=connection)
        result: int = await self._basic_publish(cmd, producer=self._outer_config.producer,
                                                _extra_middlewares=())
        return result

    async def publish_batch(
        self, *messages: Any, queue: str | None = None,
        headers: dict[str, Any] | None = None, correlation_id: str | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        next_attempt_at: datetime | None = None, priority: int | None = None,
        expires: float | timedelta | datetime | None = None,
        dedup_keys: list[str | None] | None = None, channel: str | None = None,
        connection: AsyncConnection | AsyncSession | None = None,
    ) -> list[int]:
        """Publish many messages at once (one write); their ids in order."""
        if not messages:
            return []
        cmd = self._command(
            messages, queue, headers, correlation_id=correlation_id
            or self._outer_config.id_generator(), delay=delay, at=at or next_attempt_at,
            priority=priority, expires=expires, dedup_keys=dedup_keys, channel=channel,
            connection=connection)
        result: list[int] = await self._basic_publish_batch(
            cmd, producer=self._outer_config.producer, _extra_middlewares=())
        return result

    async def _publish(self, cmd: PublishCommand, *,
                       _extra_middlewares: Iterable[PublisherMiddleware]) -> None:
        """A handler's return value, in the subscriber's flow (any broker's subscriber)."""
        command = SqlmqPublishCommand.from_cmd(cmd)
        command.destination = self.queue
        command.add_headers(self.headers, override=False)
        for name, value in self.options.items():
            if getattr(command, name, None) in (None, 0):
                setattr(command, name, value)
        await self._basic_publish(command, producer=self._outer_config.producer,
                                  _extra_middlewares=_extra_middlewares)

    async def request(  # type: ignore[override]
        self, message: Any = None, queue: str | None = None, *,
        headers: dict[str, Any] | None = None, correlation_id: str | None = None,
        priority: int | None = None, expires: float | timedelta | datetime | None = None,
        dedup_key: str | None = None, channel: str | None = None,
        timeout: float | None = 30.0,  # noqa: ASYNC109 (FastStream's shape)
    ) -> SqlmqMessage:
        """Publish one message (to ``queue``, else this publisher's) and wait for the result
        its subscriber keeps: see :meth:`~sqlmq.faststream.SqlmqBroker.request`."""
        cmd = self._command(
            (message,), queue, headers, correlation_id=correlation_id
            or self._outer_config.id_generator(), priority=priority, expires=expires,
            dedup_key=dedup_key, channel=channel, timeout=timeout,
            _publish_type=PublishType.REQUEST)
        response: SqlmqMessage = await self._basic_request(
            cmd, producer=self._outer_config.producer)
        return response


def create_publisher(queue: str, *, config: SqlmqBrokerConfig, headers: dict[str, str] | None,
                     options: dict[str, Any], title: str | None, description: str | None,
                     schema: Any | None, include_in_schema: bool) -> SqlmqPublisher:
    specification = SqlmqPublisherSpecification(
        config, SqlmqPublisherSpecificationConfig(
            queue=queue, schema_=schema, title_=title, description_=description,
            include_in_schema=include_in_schema))
    return SqlmqPublisher(SqlmqPublisherConfig(queue=queue, headers=headers, options=options,
                                               _outer_config=config), specification)
