"""The message a FastStream handler receives from sqlmq, and the parser that makes it.

:class:`SqlmqMessage` is FastStream's ``StreamMessage`` around one delivery of sqlmq (a
:class:`sqlmq.Message`, its ``raw_message``). FastStream's ack, nack and reject (by hand or
by the ack policy) become sqlmq's, so the settle is sqlmq's own fenced, batched write; what
FastStream has no word for (defer with saved state, lease extension, cancellation) is here
too, and on ``raw_message``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from faststream.message import StreamMessage
from faststream.message.message import AckStatus
from faststream.message.utils import decode_message

from sqlmq.codec import CONTENT_TYPE, decode

if TYPE_CHECKING:
    from sqlmq import Message

#: The headers FastStream's correlation id and reply-to queue travel in.
CORRELATION_ID = "correlation_id"
REPLY_TO = "reply_to"

_KEEP: Any = object()  # defer(): keep the state saved before


class SqlmqMessage(StreamMessage["Message"]):
    """One delivery of an sqlmq message, as FastStream handlers and middlewares see it.

    ``body`` is the payload's bytes (the handler's annotation decides what it becomes);
    ``message_id`` is sqlmq's id as text. Settling it by hand settles the sqlmq message;
    a second decision in the same delivery is ignored, as FastStream ignores a second ack.
    """

    @property
    def id(self) -> int:
        """sqlmq's message id."""
        return self.raw_message.id

    @property
    def queue(self) -> str:
        return self.raw_message.queue

    @property
    def attempts(self) -> int:
        """Attempts finished before this one."""
        return self.raw_message.attempts

    @property
    def deliveries(self) -> int:
        """Deliveries so far, this one included."""
        return self.raw_message.deliveries

    @property
    def priority(self) -> int:
        return self.raw_message.priority

    @property
    def channel(self) -> str | None:
        return self.raw_message.channel

    @property
    def state(self) -> Any:
        """What the handler saved with its last :meth:`defer` (None before the first)."""
        return self.raw_message.state

    @property
    def cancel_requested(self) -> bool:
        """Whether ``Broker.cancel`` asked for this message while it runs."""
        return self.raw_message.cancel_requested

    def _undecided(self) -> bool:
        return self.raw_message.decision is None

    async def ack(self) -> None:
        """Archive it COMPLETED once the handler is done."""
        if self._undecided():
            self.raw_message.ack()
        await super().ack()

    async def nack(self, delay: float | timedelta | None = None) -> None:
        """Ask for a retry: the subscriber's retry strategy decides whether one is left
        and when (``delay`` overrides its delay)."""
        if self._undecided():
            self.raw_message.nack(delay)
        await super().nack()

    async def reject(self, reason: str | None = None) -> None:
        """Archive it FAILED at once (a dead letter), with ``reason`` as its error."""
        if self._undecided():
            self.raw_message.reject(reason)
        await super().reject()

    async def defer(self, delay: float | timedelta | None = None, *,
                    at: datetime | None = None, state: Any = _KEEP) -> None:
        """Put it back to wait for ``delay`` or until ``at``, saving ``state`` for its next
        delivery (see :meth:`sqlmq.Message.defer`): not an attempt, not a failure. The ack
        policy then leaves it alone."""
        if self._undecided():
            if state is _KEEP:
                self.raw_message.defer(delay, at=at)
            else:
                self.raw_message.defer(delay, at=at, state=state)
        if self.committed is None:
            self.committed = AckStatus.NACKED  # back to the queue, as a nack would be

    async def extend(self, seconds: float) -> bool:
        """Push this delivery's lease to now + ``seconds``; False if it was lost already."""
        return await self.raw_message.extend(seconds)


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to a FastStream ``request``: the result the subscriber kept, encoded
    (see :meth:`sqlmq.Broker.request`), as the parser reads it into FastStream's response
    message (``body``, ``decode()``, ``headers``, ``correlation_id``)."""

    queue: str
    headers: dict[str, str]
    payload: bytes
    id: int | None = None


class SqlmqParser:
    """sqlmq's delivery to FastStream's message, and its body to a Python value."""

    async def parse_message(self, message: Message | Reply) -> SqlmqMessage:
        headers = message.headers
        return SqlmqMessage(
            raw_message=message,  # type: ignore[arg-type]  # a Reply: a request's answer
            body=message.payload,
            headers=headers,
            reply_to=headers.get(REPLY_TO, ""),
            content_type=headers.get(CONTENT_TYPE),
            correlation_id=headers.get(CORRELATION_ID),
            message_id="" if message.id is None else str(message.id),
        )

    async def decode_message(self, msg: StreamMessage[Any]) -> Any:
        """By the content type as sqlmq writes and reads it (JSON and ``+json``, text with
        a charset, else bytes), so a message published with sqlmq's own API decodes as it
        would for a plain sqlmq handler; without one, as FastStream guesses (JSON, else
        the bytes)."""
        if msg.content_type:
            return decode(msg.body, msg.content_type)
        return decode_message(msg)
