"""Bodies to bytes and back. The content type travels in the ``content-type`` header, so a
consumer in another language (or Spark) can read the payload without guessing."""

from __future__ import annotations

import json
from typing import Any

from .errors import DecodeError, EncodeError

CONTENT_TYPE = "content-type"
#: The header each copy of a topic publish carries: the topic it was published to (a
#: subscriber of ``orders.*`` reads there which one it got; see :mod:`sqlmq.topics`).
TOPIC_HEADER = "topic"
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
BYTES_TYPE = "application/octet-stream"


def encode(body: Any) -> tuple[bytes, str]:
    """Return ``(payload, content_type)`` or raise :class:`EncodeError` naming the problem."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), BYTES_TYPE
    if isinstance(body, str):
        return body.encode("utf-8", "surrogatepass"), TEXT_TYPE
    dump = getattr(body, "model_dump_json", None)
    if callable(dump) and not isinstance(body, type):  # a pydantic v2 model instance
        return dump().encode(), JSON_TYPE
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise EncodeError(
            f"cannot encode a body of type {type(body).__name__}: {exc}; pass bytes, str, a "
            "JSON-serialisable value or a pydantic model"
        ) from None
    return text.encode("utf-8", "surrogatepass"), JSON_TYPE


def decode(payload: bytes, content_type: str | None) -> Any:
    """Decode by content type: JSON to Python values, text to str, anything else as bytes."""
    kind = (content_type or BYTES_TYPE).split(";", 1)[0].strip().lower()
    try:
        if kind == JSON_TYPE or kind.endswith("+json"):
            return json.loads(payload)
        if kind.startswith("text/"):
            return payload.decode("utf-8", "surrogatepass")
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError(f"payload is not valid {kind}: {exc}") from None
    return payload


def encode_state(value: Any) -> bytes:
    """A handler's saved state (``msg.defer(state=)``) as the bytes stored on its row: its
    content type, a newline, then the value encoded as a body is (bytes stay bytes, other
    values become JSON or text), so it decodes to what was saved."""
    payload, content_type = encode(value)
    return content_type.encode() + b"\n" + payload


def decode_state(stored: bytes | None) -> Any:
    """The value :func:`encode_state` stored (None: nothing saved)."""
    if stored is None:
        return None
    content_type, sep, payload = bytes(stored).partition(b"\n")
    if not sep:
        raise DecodeError("saved state is not in sqlmq's format (no content type line)")
    return decode(payload, content_type.decode("ascii", "replace"))
