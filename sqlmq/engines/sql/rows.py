"""Decoding acquired rows into deliveries, for every SQL engine: the hot path's batch
decoders (the MariaDB and SQLite engines read plain tuples) and the checks that turn a row
sqlmq did not write into a clear defect instead of a failed batch."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from ...records import Delivery, NewMessage

# ---- decoding a batch of rows (the MariaDB and SQLite engines read plain tuples) -------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ready_order(d: Delivery) -> tuple[int, datetime, int]:
    """The order acquire hands messages out in: highest priority first, then by schedule,
    then id."""
    return (-d.priority, d.scheduled_at or _EPOCH, d.id)


class RowDecodeError(ValueError):
    """A column of an acquired row that does not hold what sqlmq wrote there (a hand edit,
    another writer, a bad migration); the message names the column and the problem."""


class BatchHeaders(dict[Any, dict[str, str]]):
    """Decodes the headers of one batch, each distinct text once: messages published
    together mostly carry the same headers. Every message gets its own dict (a handler may
    change it); headers map strings to strings, so a shallow copy is a full one."""

    def __call__(self, value: str | bytes | None) -> dict[str, str]:
        if value is None:
            return {}
        decoded = self.get(value)
        if decoded is None:
            decoded = self[value] = headers_of(value)
        return dict(decoded)


class BatchHeaderTexts(dict[int, str]):
    """Encodes the headers of one batch being published, each distinct dict once: a batch
    shares one dict per content type (see :func:`sqlmq.publishing.prepare`), told apart by
    identity, so equal dicts from elsewhere are merely encoded twice. The batch's messages
    keep their dicts alive meanwhile, so an id is not reused."""

    def __call__(self, headers: dict[str, str]) -> str:
        text = self.get(id(headers))
        if text is None:
            text = self[id(headers)] = json.dumps(headers)
        return text


def headers_of(value: Any) -> dict[str, str]:
    """Checked once per distinct text: the runtime and handlers rely on string values."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowDecodeError(f"headers are not valid JSON: {exc}") from None
    value = value or {}
    if not isinstance(value, dict):
        raise RowDecodeError(f"headers are a JSON {_json_kind(value)}, not an object")
    for key, item in value.items():
        if not isinstance(item, str):
            raise RowDecodeError(f"header {key!r} is a JSON {_json_kind(item)}, not a string")
    return value


def decode_history(value: Any) -> list[dict[str, Any]]:
    """A row's ``history`` column: a JSON array of objects (the runtime reads their keys)."""
    if value is None:
        return []
    if isinstance(value, str | bytes):
        if value == "[]":
            return []
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowDecodeError(f"history is not valid JSON: {exc}") from None
    if not isinstance(value, list):
        raise RowDecodeError(f"history is a JSON {_json_kind(value)}, not an array")
    for entry in value:
        if not isinstance(entry, dict):
            raise RowDecodeError(f"history holds a JSON {_json_kind(entry)}, not an object")
    return value


def blob(value: Any) -> bytes:
    """A row's ``payload``, which sqlmq always writes as a BLOB (SQLite lets a hand edit store
    TEXT or a number there instead)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    kind = "TEXT" if isinstance(value, str) else type(value).__name__
    raise RowDecodeError(f"payload is stored as {kind}, not as a BLOB")


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def decode_rows(rows: Sequence[Any], decode: Callable[[Any], Delivery],
                undecodable: Callable[[Any, BaseException], Delivery]) -> list[Delivery]:
    """Deliveries from the rows of one acquire. The rows are already PROCESSING when they
    are decoded, so a row that fails must not take its batch down with it: the whole batch
    is decoded at once (the hot path), and only if that fails is each row decoded alone,
    those that fail becoming ``undecodable(row, error)`` (a delivery with ``defect`` set,
    which the runtime archives FAILED through the usual fenced settle)."""
    try:
        return [decode(r) for r in rows]
    except Exception:
        pass
    out = []
    for r in rows:
        try:
            out.append(decode(r))
        except Exception as exc:
            out.append(undecodable(r, exc))
    return out


def undecodable_delivery(msg_id: int, queue: str, attempts: int, deliveries: int,
                         exc: BaseException) -> Delivery:
    """The delivery of a row that could not be decoded: its fencing token and counters, and
    the reason; nothing else of it is read."""
    reason = str(exc) if isinstance(exc, RowDecodeError) else f"{type(exc).__name__}: {exc}"
    return Delivery(msg_id, queue, {}, b"", attempts, deliveries, _EPOCH, None, _EPOCH, _EPOCH,
                    _EPOCH, [], f"undecodable row: {reason}"[:2000])


def leased_delivery(message: NewMessage, msg_id: int, now: datetime,
                    lease_expires_at: datetime, expires_at: datetime | None = None) -> Delivery:
    """The delivery of a message published already acquired (``publish_leased``): the row
    an acquire at ``now`` would have left, its first delivery; ``expires_at`` as stored."""
    return Delivery(msg_id, message.queue, dict(message.headers), message.payload, 0, 1, now,
                    now, now, lease_expires_at, now, [], priority=message.priority,
                    expires_at=expires_at)


class BatchTimes(dict[Any, datetime]):
    """The driver's values of one batch's timestamps as aware UTC datetimes, each distinct
    value converted once: a batch's rows share their acquisition and lease times, and often
    their creation and schedule (datetimes are immutable, so sharing them is safe)."""

    def __init__(self, convert: Callable[[Any], datetime]) -> None:
        super().__init__()
        self.convert = convert

    def __call__(self, value: Any) -> Any:
        if value is None:
            return None
        converted = self.get(value)
        if converted is None:
            try:
                converted = self[value] = self.convert(value)
            except Exception as exc:  # e.g. text that is no date, 'infinity' on PostgreSQL
                raise RowDecodeError(f"malformed timestamp {value!r}: {exc}") from None
        return converted

