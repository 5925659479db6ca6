"""Every error sqlmq raises on purpose derives from :class:`SqlmqError`.

Each names the problem in its message, so the user can act on it without reading code.
"""

from __future__ import annotations


class SqlmqError(Exception):
    """Base class for sqlmq's own errors."""


class ConfigurationError(SqlmqError, ValueError):
    """A URL, option or table prefix sqlmq cannot work with."""


class SchemaError(SqlmqError):
    """The database schema is missing or older than this version of sqlmq expects."""


class UnknownGroup(SqlmqError, LookupError):
    """A consumer group of a topic that does not exist."""


class UnknownSchedule(SqlmqError, LookupError):
    """A periodic schedule the database does not know (see :mod:`sqlmq.schedules`)."""


class UnknownWorkflow(SqlmqError, LookupError):
    """A workflow name that no publish used (see :mod:`sqlmq.workflows`)."""


class PublishError(SqlmqError, ValueError):
    """A message that cannot be published as given; nothing was written."""


class EncodeError(PublishError, TypeError):
    """A body the codec cannot turn into bytes."""


class PayloadTooLarge(PublishError):
    """A payload above the broker's ``max_payload_bytes``."""


class ChannelFull(PublishError):
    """A publish that would leave more messages in a channel than its ``max_size``; nothing
    was written."""


class PipelineError(PublishError):
    """A pipeline step's return value that cannot be published onward (one its codec cannot
    encode, or too large): the step fails as if its handler had raised this."""


class DecodeError(SqlmqError):
    """A payload that cannot be decoded into what the handler asks for."""


class HandlerSignatureError(SqlmqError, TypeError):
    """A handler whose signature sqlmq cannot satisfy."""


class AlreadySettled(SqlmqError):
    """A message was acknowledged, nacked or rejected twice within one delivery."""


class ConnectTimeout(SqlmqError, TimeoutError):
    """The database server accepted the connection but did not complete the handshake in
    time (a TimeoutError, so retry loops treat it like any other lost connection)."""


class PublishOutcomeUnknown(SqlmqError, ConnectionError):
    """The connection to the database was lost after a publish was sent and before its
    commit was confirmed: the messages may or may not be in the queue. sqlmq does not send
    it again, which could publish them twice; the caller decides (look for them, or publish
    again and accept a duplicate). A ConnectionError, so retry loops treat it like any other
    lost connection."""


class UnstorableResult(SqlmqError):
    """A return value a subscriber with ``results=True`` cannot keep (one its codec cannot
    encode, or over ``max_payload_bytes``): the run fails as if its handler had raised
    this, and the retry strategy decides."""


class ResultError(SqlmqError):
    """What ``Broker.result`` (and ``request``) raises in place of a value: the message
    ended otherwise than COMPLETED with a kept result, or has not ended in time. ``msg_id``
    names the message, ``state`` its state as last read (None: no such message)."""

    def __init__(self, text: str, msg_id: int, state: str | None) -> None:
        super().__init__(text)
        self.msg_id = msg_id
        self.state = state


class MessageFailed(ResultError):
    """The message was archived FAILED (a dead letter). ``error`` is the error the archive
    keeps: the last failure's line and traceback, or why it was rejected."""

    def __init__(self, text: str, msg_id: int, state: str | None,
                 error: str | None) -> None:
        super().__init__(text, msg_id, state)
        self.error = error


class MessageCancelled(ResultError):
    """The message was archived CANCELLED (``Broker.cancel``): it will not run."""


class MessageExpired(ResultError):
    """The message was archived EXPIRED: it was taken after its ``expires`` moment, and
    never ran."""


class NoResult(ResultError, LookupError):
    """The message COMPLETED but no result was kept: its subscriber was registered without
    ``results=True``, or its handler raised and ``ack_policy`` ACK completed it all the
    same."""


class UnknownMessage(ResultError, LookupError):
    """No message with that id is waiting, running or in the archive: never published, not
    committed yet, or deleted (retention, a purge, a subscriber whose ``archive=`` keeps
    no such ending)."""


class ResultTimeout(ResultError, TimeoutError):
    """The message has not ended within the time given (or at once, with ``wait=False``).
    It goes on: waiting or running, it may still end, and its result will be kept."""
