"""The runtime's side of results: a handler's return value encoded for its archive row,
and which settlements announce their ending to waiting callers."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..codec import encode_state
from ..errors import UnstorableResult
from ..lifecycle import Outcome, Settlement, error_text
from ..workflows.records import WORKFLOW_HEADER

log = logging.getLogger("sqlmq")

#: The header ``Broker.request`` puts on its message: a caller waits for its result. A
#: subscriber without ``results=True`` that takes such a message says so in the log (the
#: caller will get :class:`~sqlmq.errors.NoResult`), and announces its ending all the same,
#: so that the caller learns of a failure at once.
AWAITED_HEADER = "awaited"
#: The header's value.
AWAITED = "result"


def kept(value: Any, max_payload_bytes: int, handler: str, msg_id: int) -> bytes:
    """``handler``'s return ``value`` for message ``msg_id`` as its archive row keeps it; a
    value that cannot be kept raises :class:`~sqlmq.errors.UnstorableResult` naming why."""
    try:
        stored = encode_state(value)
    except Exception as exc:
        raise UnstorableResult(f"handler {handler} returned a value that cannot be kept as "
                               f"the result of message {msg_id}: {error_text(exc)}") from exc
    if len(stored) > max_payload_bytes:
        raise UnstorableResult(
            f"handler {handler} returned a result of {len(stored)} bytes for message "
            f"{msg_id}, over the limit of {max_payload_bytes} (max_payload_bytes)")
    return stored


def kept_each(value: Any, count: int, handler: str) -> list[Any]:
    """A batch handler's return ``value`` as one result per message of its batch of
    ``count``: the i-th item is the i-th message's. Anything else raises
    :class:`~sqlmq.errors.UnstorableResult` naming the handler, the length expected and the
    one got, since no message can be given a result it was not returned."""
    if not isinstance(value, (list, tuple)):
        raise UnstorableResult(
            f"batch handler {handler} keeps results (results=True) and returned a "
            f"{type(value).__name__}: it must return a list of {count} results, one per "
            f"message of its batch, in the order it received them")
    if len(value) != count:
        raise UnstorableResult(
            f"batch handler {handler} keeps results (results=True) and returned a list of "
            f"{len(value)} for a batch of {count} messages: it must return one result per "
            f"message, in the order it received them (expected {count}, got {len(value)})")
    return list(value)


def awaited(headers: Mapping[str, str]) -> bool:
    """Whether a caller waits for this message's result (``Broker.request`` sent it)."""
    return headers.get(AWAITED_HEADER) == AWAITED


#: The outcomes whose settle may end a message: archived, or a defer that archives it
#: CANCELLED when its cancellation was asked for meanwhile.
_ENDING = frozenset(o for o in Outcome if o.archives) | {Outcome.DEFER}


class Announcer:
    """Marks the settlements a caller may be waiting for (``Settlement.answers``): every
    ending of a subscriber that keeps results, and of a message a caller awaits; and the
    endings of workflows' steps (``Settlement.step``). Warns once per subscriber that takes
    awaited messages without keeping results."""

    def __init__(self, results: bool, handler: str) -> None:
        self.results = results
        self.handler = handler
        self._warned = False

    def mark(self, s: Settlement, headers: Mapping[str, str]) -> None:
        if s.outcome not in _ENDING:
            return
        if WORKFLOW_HEADER in headers:
            # A workflow's step: its ending releases or cancels the steps that wait on it,
            # and they, and its status, read it in the archive.
            s.step = True
            s.keep = True
        if self.results:
            s.answers = True
        elif awaited(headers):
            s.answers = True
            if not self._warned:
                self._warned = True
                log.warning("handler %s took message %d, whose result a caller awaits "
                            "(Broker.request), but keeps no results: register it with "
                            "results=True (the caller gets NoResult)", self.handler, s.id)


__all__ = ["AWAITED", "AWAITED_HEADER", "Announcer", "awaited", "kept", "kept_each"]
