"""Handler annotations, as FastStream's brokers export them: ``msg: SqlmqMessage`` gets the
FastStream message, ``raw: SqlmqRawMessage`` the :class:`sqlmq.Message` underneath,
``broker: SqlmqBroker`` the broker (``Context()`` under the hood: no body validation)."""

from __future__ import annotations

from typing import Annotated

from faststream import Context

from sqlmq import Message as _RawMessage

from .broker import SqlmqBroker as _Broker
from .message import SqlmqMessage as _Message

SqlmqMessage = Annotated[_Message, Context("message")]
SqlmqRawMessage = Annotated[_RawMessage, Context("message.raw_message")]
SqlmqBroker = Annotated[_Broker, Context("broker")]

__all__ = ["SqlmqBroker", "SqlmqMessage", "SqlmqRawMessage"]
