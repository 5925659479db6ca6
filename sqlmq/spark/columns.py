"""The columns a Spark reader sees, and rows of the message or archive table as Arrow.

Readers hand Spark ``pyarrow.RecordBatch`` es rather than Python tuples: it is several
times faster per row, which is most of a micro-batch's cost.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..codec import CONTENT_TYPE, JSON_TYPE

_COMMON = [
    ("id", "long"), ("queue", "string"), ("headers", "map<string,string>"),
    ("payload", "binary"), ("body", "string"), ("state", "string"), ("attempts", "int"),
    ("deliveries", "int"), ("created_at", "timestamp"), ("first_attempt_at", "timestamp"),
    ("last_attempt_at", "timestamp"),
]
#: Live queue rows (batch reads of the message table and streams).
MESSAGE_COLUMNS = [*_COMMON, ("next_attempt_at", "timestamp"),
                   ("lease_expires_at", "timestamp"), ("error", "string")]
#: Archived rows.
ARCHIVE_COLUMNS = [*_COMMON, ("archived_at", "timestamp"), ("error", "string")]

# Spark column -> database column, where they differ.
DB_NAMES = {"attempts": "attempts_count", "deliveries": "deliveries_count"}


def ddl(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in columns)


def db_columns(table: Any, columns: Sequence[tuple[str, str]],
               timestamp: Callable[[Any], Any] | None = None) -> list[Any]:
    """What to select for ``columns`` (``body`` is worked out of the payload, not selected),
    with timestamps as the database's Spark ledger selects them (``timestamp``): on
    PostgreSQL, integer microseconds since the epoch, which Arrow takes as they are, where
    datetimes cost a Python object and a conversion per value (see :func:`record_batch`)."""
    out = []
    for name, kind in columns:
        if name == "body":
            continue
        if name == "error":
            col = table.c.error if "error" in table.c else table.c.last_error
        else:
            col = table.c[DB_NAMES.get(name, name)]
        if kind == "timestamp" and timestamp is not None:
            col = timestamp(col)
        out.append(col.label(name))
    return out


def body_of(payload: bytes, headers: dict[str, str]) -> str | None:
    """The payload as text where the content type says it is text or JSON, else null."""
    if _is_text(headers.get(CONTENT_TYPE)):
        try:
            return payload.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _headers(value: Any) -> dict[str, str]:
    if isinstance(value, str | bytes):
        value = json.loads(value)
    if not value:
        return {}
    if all(type(v) is str for v in value.values()):
        return value  # type: ignore[no-any-return]  # JSON object keys are str already
    return {str(k): str(v) for k, v in value.items()}


def _header_column(values: list[Any]) -> list[dict[str, str]]:
    """:func:`_headers` for a column. Headers given as JSON text are parsed once per
    distinct text: most messages of a queue carry the same few (a content type), and
    parsing is most of the Python work of a read. The dicts are shared, never changed."""
    parsed: dict[Any, dict[str, str]] = {}
    out: list[dict[str, str]] = []
    for v in values:
        if type(v) is str:
            h = parsed.get(v)
            if h is None:
                h = parsed[v] = _headers(v)
            out.append(h)
        else:
            out.append(_headers(v))
    return out


def _is_text(content_type: str | None) -> bool:
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind == JSON_TYPE or kind.endswith("+json") or kind.startswith("text/")


def _bodies(payloads: list[bytes], headers: list[dict[str, str]]) -> list[str | None]:
    """:func:`body_of` for a column, deciding once per distinct content type."""
    text: dict[str | None, bool] = {}
    out: list[str | None] = []
    for p, h in zip(payloads, headers, strict=True):
        ct = h.get(CONTENT_TYPE)
        ok = text.get(ct)
        if ok is None:
            ok = text[ct] = _is_text(ct)
        if ok:
            try:
                out.append(p.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(None)
        else:
            out.append(None)
    return out


def _map_array(headers: list[dict[str, str]]) -> Any:
    """A ``map<string,string>`` column straight from offsets, keys and values."""
    import pyarrow as pa

    offsets = [0]
    keys: list[str] = []
    values: list[str] = []
    for h in headers:
        keys.extend(h)
        values.extend(h.values())
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()))


def _timestamps(values: list[Any]) -> Any:
    import pyarrow as pa

    kind = pa.timestamp("us", tz="UTC")
    first = next((v for v in values if v is not None), None)
    if isinstance(first, int):  # epoch microseconds (PostgreSQL, see db_columns)
        return pa.array(values, pa.int64()).cast(kind)
    return pa.array(values, kind)


def arrow_schema(columns: Sequence[tuple[str, str]]) -> Any:
    import pyarrow as pa

    kinds = {
        "long": pa.int64(), "string": pa.string(), "binary": pa.binary(), "int": pa.int32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "map<string,string>": pa.map_(pa.string(), pa.string()),
    }
    return pa.schema([(name, kinds[kind]) for name, kind in columns])


def record_batch(
    names: Sequence[str], rows: Sequence[Sequence[Any]], columns: Sequence[tuple[str, str]],
    given: dict[str, list[Any]] | None = None,
) -> Any:
    """One Arrow batch of ``columns`` from rows of the selected ``names`` (built column by
    column: the per-row Python work is the cost of a read). ``given`` supplies whole
    columns, such as the stream's own delivery numbers."""
    import pyarrow as pa

    selected = dict(zip(names, (list(c) for c in zip(*rows, strict=True)), strict=True)) \
        if rows else {n: [] for n in names}
    headers = _header_column(selected["headers"])
    payloads = [p if type(p) is bytes else bytes(p) for p in selected["payload"]]
    schema = arrow_schema(columns)
    arrays: list[Any] = []
    for (name, kind), target in zip(columns, schema.types, strict=True):
        if given and name in given:
            values = given[name]
        elif name == "headers":
            arrays.append(_map_array(headers))
            continue
        elif name == "payload":
            values = payloads
        elif name == "body":
            values = _bodies(payloads, headers)
        else:
            values = selected[name]
        arrays.append(_timestamps(values) if kind == "timestamp" else pa.array(values, target))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def record_batches(result: Any, columns: Sequence[tuple[str, str]],
                   size: int = 10_000) -> Iterator[Any]:
    """A SQLAlchemy result as Arrow batches of up to ``size`` rows."""
    names = list(result.keys())
    for chunk in result.partitions(size):
        yield record_batch(names, chunk, columns)
