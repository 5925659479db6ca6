"""The decorators of :class:`~sqlmq.faststream.SqlmqBroker` and
:class:`~sqlmq.faststream.SqlmqRouter`: ``subscriber`` and ``publisher``.

``subscriber`` takes sqlmq's own options (those of :meth:`sqlmq.Broker.subscriber`) and
FastStream's; a few names of faststream-sqlbroker (``queues``, ``max_workers``,
``fetch_batch_size``, ``retry_strategy``, ...) are accepted too, as the sqlmq option they
mean, so its examples run with a changed import (``docs/faststream.md`` lists the rest).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, cast

from faststream._internal.broker.registrator import Registrator
from faststream.exceptions import SetupError

from sqlmq import Message
from sqlmq.lifecycle import Archive

from .config import SqlmqBrokerConfig
from .publisher import SqlmqPublisher, create_publisher
from .subscriber import SqlmqSubscriber, create_subscriber, faststream_policy

if TYPE_CHECKING:
    from fast_depends.dependencies import Dependant
    from faststream._internal.types import CustomCallable
    from faststream.middlewares import AckPolicy

    from sqlmq.lifecycle import AckPolicy as SqlmqAckPolicy
    from sqlmq.retry import RetryStrategy


def _names(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def sqlbroker_options(
    options: dict[str, Any], *, max_workers: int | None, fetch_batch_size: int | None,
    retry_strategy: RetryStrategy | None, overfetch_factor: float | None,
    release_stuck_interval: float | None, release_stuck_timeout: float | None,
    retain_in_archive_on_ack: bool | None, retain_in_archive_on_reject: bool | None,
) -> dict[str, Any]:
    """faststream-sqlbroker's subscriber options as the sqlmq options they mean; sqlmq's
    own name wins when both are given."""
    aliases = {"workers": max_workers, "fetch_batch": fetch_batch_size,
               "retry": retry_strategy, "recovery_interval": release_stuck_interval,
               "lease": release_stuck_timeout}
    for name, value in aliases.items():
        if value is not None and options.get(name) is None:
            options[name] = value
    if overfetch_factor is not None and options.get("prefetch") is None:
        options["prefetch"] = max(1, round((options.get("fetch_batch") or 1000)
                                           * overfetch_factor))
    if retain_in_archive_on_ack is not None or retain_in_archive_on_reject is not None:
        keep_acked = retain_in_archive_on_ack is not False
        keep_failed = retain_in_archive_on_reject is not False
        if keep_acked and not keep_failed:
            raise SetupError("sqlmq keeps either every ended message, the failed ones, or "
                             "none (archive='all', 'failed', 'none'): not only the acked ones")
        options.setdefault("archive", Archive.ALL if keep_acked else
                           Archive.FAILED if keep_failed else Archive.NONE)
    return {k: v for k, v in options.items() if v is not None}


class SqlmqRegistrator(Registrator[Message, SqlmqBrokerConfig]):
    """``subscriber`` and ``publisher`` for sqlmq's queues."""

    def subscriber(  # type: ignore[override]
        self, queue: str | Sequence[str] | None = None, *,
        queues: Sequence[str] | None = None, topic: str | Sequence[str] | None = None,
        group: str | None = None, workers: int | None = None, fetch_batch: int | None = None,
        prefetch: int | None = None, min_fetch_interval: float | None = None,
        max_fetch_interval: float | None = None, flush_interval: float | None = None,
        flush_batch: int | None = None, max_unflushed: int | None = None,
        lease: float | None = None, renew_leases: bool | None = None,
        recovery_interval: float | None = None,
        max_deliveries: int | Literal["auto"] | None = "auto",
        retry: RetryStrategy | None = None, graceful_timeout: float | None = None,
        publish_to: str | None = None, archive: Archive | str | None = None,
        results: bool | None = None,
        ack_policy: AckPolicy | SqlmqAckPolicy | str | None = None, no_reply: bool = False,
        dependencies: Iterable[Dependant] = (), parser: CustomCallable | None = None,
        decoder: CustomCallable | None = None, title: str | None = None,
        description: str | None = None, include_in_schema: bool = True,
        persistent: bool = True,
        # faststream-sqlbroker's names for sqlmq's options
        max_workers: int | None = None, fetch_batch_size: int | None = None,
        retry_strategy: RetryStrategy | None = None, overfetch_factor: float | None = None,
        release_stuck_interval: float | None = None,
        release_stuck_timeout: float | None = None,
        retain_in_archive_on_ack: bool | None = None,
        retain_in_archive_on_reject: bool | None = None,
    ) -> SqlmqSubscriber:
        """A subscriber of ``queue`` (one or several; or of ``topic`` in ``group``), run by
        sqlmq with its options (see :meth:`sqlmq.Broker.subscriber`: ``workers``, ``lease``,
        ``retry``, ``publish_to``, ``archive``, ``results``, ...). ``ack_policy``: FastStream's
        (``NACK_ON_ERROR`` by default, so the retry strategy decides); ``ACK_FIRST`` is
        ``ACK`` here, as sqlmq writes a result only once its handler ended. Decorate the
        handler with the returned subscriber."""
        options = sqlbroker_options(
            {"workers": workers, "fetch_batch": fetch_batch, "prefetch": prefetch,
             "min_fetch_interval": min_fetch_interval, "max_fetch_interval": max_fetch_interval,
             "flush_interval": flush_interval, "flush_batch": flush_batch,
             "max_unflushed": max_unflushed, "lease": lease, "renew_leases": renew_leases,
             "recovery_interval": recovery_interval, "retry": retry,
             "graceful_timeout": graceful_timeout, "publish_to": publish_to,
             "archive": archive, "results": results},
            max_workers=max_workers, fetch_batch_size=fetch_batch_size,
            retry_strategy=retry_strategy, overfetch_factor=overfetch_factor,
            release_stuck_interval=release_stuck_interval,
            release_stuck_timeout=release_stuck_timeout,
            retain_in_archive_on_ack=retain_in_archive_on_ack,
            retain_in_archive_on_reject=retain_in_archive_on_reject)
        options["max_deliveries"] = max_deliveries
        consumed = _names(queue) + _names(queues)
        if not consumed and not topic:
            raise SetupError("a subscriber needs a queue (or topic= and group=)")
        subscriber = create_subscriber(
            config=cast("SqlmqBrokerConfig", self.config), queues=consumed,
            topic=_names(topic), group=group, options=options,
            ack_policy=faststream_policy(ack_policy), no_reply=no_reply, title=title,
            description=description, include_in_schema=include_in_schema)
        super().subscriber(subscriber, persistent=persistent)
        if publish_to is not None:  # the pipeline's output queue, in the AsyncAPI document
            subscriber.outputs = self.publisher(
                publish_to, include_in_schema=include_in_schema,
                description="The return values of the handler of "
                f"{', '.join(consumed or _names(topic))}, published in the transaction that "
                "archives their input", persistent=persistent)
        subscriber.add_call(parser_=parser, decoder_=decoder, dependencies_=tuple(dependencies))
        return subscriber

    def publisher(  # type: ignore[override]
        self, queue: str = "", *, headers: dict[str, str] | None = None,
        priority: int | None = None, channel: str | None = None,
        delay: float | timedelta | None = None, at: datetime | None = None,
        expires: float | timedelta | datetime | None = None, title: str | None = None,
        description: str | None = None, schema: Any | None = None,
        include_in_schema: bool = True, persistent: bool = True,
    ) -> SqlmqPublisher:
        """A publisher of ``queue``: decorate a handler to publish its return value there,
        or call its ``publish``. ``headers``, ``priority``, ``channel``, ``delay``, ``at``
        and ``expires`` apply to each of its messages (a call's own win)."""
        options = {"priority": priority, "channel": channel, "delay": delay, "at": at,
                   "expires": expires}
        publisher = create_publisher(
            queue, config=cast("SqlmqBrokerConfig", self.config), headers=headers,
            options={k: v for k, v in options.items() if v is not None}, title=title,
            description=description, schema=schema, include_in_schema=include_in_schema)
        super().publisher(publisher, persistent=persistent)
        return publisher
