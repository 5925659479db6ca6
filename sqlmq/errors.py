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
