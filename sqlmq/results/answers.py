"""A message's ending as a waiting caller receives it: the kept value, or the error that
says how it ended otherwise."""

from __future__ import annotations

from typing import Any

from ..codec import decode_state
from ..errors import (
    MessageCancelled,
    MessageExpired,
    MessageFailed,
    NoResult,
    ResultTimeout,
    UnknownMessage,
)
from ..lifecycle import State
from ..records import Answer


def value_of(msg_id: int, answer: Answer | None, waited: float | None) -> Any:
    """What ``Broker.result`` returns for message ``msg_id`` as last read (``answer``;
    None: in neither table), or the error it raises; ``waited``: the seconds it waited
    (None: it did not), for the timeout's message."""
    if answer is None:
        raise UnknownMessage(
            f"no message {msg_id} is waiting, running or archived (never published, not "
            "committed yet, or deleted: by retention, a purge, or a subscriber whose "
            "archive= keeps no such ending)", msg_id, None)
    state = answer.state
    if state == State.COMPLETED:
        if answer.result is None:
            why = ("it was acknowledged (by msg.ack(), or ack_policy ACK) but its "
                   f"handler returned no value: {_first_line(answer.error)}" if answer.error else
                   "its subscriber keeps none (register it with results=True)")
            raise NoResult(f"message {msg_id} completed without a result: {why}", msg_id,
                           state)
        return decode_state(answer.result)
    if state == State.FAILED:
        raise MessageFailed(f"message {msg_id} failed: {_first_line(answer.error)} "
                            f"(sqlmq show {msg_id} has the whole error)", msg_id, state,
                            answer.error)
    if state == State.CANCELLED:
        raise MessageCancelled(f"message {msg_id} was cancelled", msg_id, state)
    if state == State.EXPIRED:
        raise MessageExpired(f"message {msg_id} expired before it ran "
                             f"({_first_line(answer.error)})", msg_id, state)
    if not answer.ended:
        after = "" if waited is None else f" after {waited:.3g} s"
        raise ResultTimeout(f"message {msg_id} has not ended{after}: it is {state}", msg_id,
                            state)
    raise UnknownMessage(f"message {msg_id} is archived as {state!r}, a state sqlmq does not "
                         "know", msg_id, state)


def _first_line(error: str | None) -> str:
    lines = (error or "").strip().splitlines()
    return lines[0] if lines else "no reason recorded"


__all__ = ["value_of"]
