"""What the dashboard's pages and JSON say, apart from the web framework: reading the query
parameters (a bad one is a :class:`Problem` naming it, shown as a 400 page), the figures as
an operator reads them (ages, rates, byte counts), a payload as text or a hex dump, and the
JSON of each endpoint.

Nothing here reads the database: the routes ask :mod:`sqlmq.insights` and the Broker, then
hand their records to these functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from ..insights import WINDOWS, Bucket, Latency, QueueDetail, QueueOverview
from ..records import PausedQueue, WorkerInfo
from ..views import ARCHIVED_STATES, ArchiveQuery, MessageView
from . import charts

#: The archive browser's page size, by default and at most (the engine allows more; a
#: page of a browser is for reading).
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
#: How much of a payload a message page shows (the whole one is a download).
PAYLOAD_SHOWN = 64 * 1024


class Problem(Exception):
    """A request the dashboard cannot answer as asked: shown as a page (or JSON) with
    ``status`` and ``message``, never a traceback."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ---- query parameters ----------------------------------------------------------------------


def one(params: Mapping[str, str], name: str, *, required: bool = False) -> str | None:
    """A text parameter as given, blanks kept (a queue name may hold them); an empty form
    field is the same as none."""
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise Problem(400, f"{name}: missing")
        return None
    if "\x00" in value:
        raise Problem(400, f"{name}: contains a NUL character")
    return value


def message_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise Problem(400, f"{text[:40]!r} is not a message id (a whole number)") from None
    if not 1 <= value <= 2**63 - 1:
        raise Problem(400, f"{value} is not a message id (ids are 1 to 2^63-1)")
    return value


def moment(name: str, text: str) -> datetime:
    """A point in time from a form: ISO 8601, with an offset or in UTC (the browser's
    ``datetime-local`` field gives ``2024-05-01T13:00``, read as UTC as the pages show)."""
    try:
        value = datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    except ValueError:
        raise Problem(400, f"{name}: {text[:40]!r} is not a date and time (write "
                           "2024-05-01T13:00, read as UTC, or add an offset: +02:00)") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def archive_query(params: Any) -> ArchiveQuery:
    """The archive search a query string asks for: ``queue``, ``state`` (repeated, any
    case), ``error`` (a substring), ``from``/``to`` (archive time), ``limit``, and the
    keyset position ``after_at``/``after_id`` of a "next page" link."""
    states = []
    for raw in params.getlist("state"):
        for state in raw.split(","):
            state = state.strip().upper()
            if not state:
                continue
            if state not in ARCHIVED_STATES:
                raise Problem(400, f"state: no archived state {state[:40]!r} (states: "
                                   f"{', '.join(ARCHIVED_STATES)})")
            if state not in states:
                states.append(state)
    frm = one(params, "from")
    to = one(params, "to")
    archived_from = None if frm is None else moment("from", frm)
    archived_to = None if to is None else moment("to", to)
    if archived_from and archived_to and archived_from >= archived_to:
        raise Problem(400, "from: must be before to")
    limit_text = one(params, "limit")
    try:
        limit = PAGE_SIZE if limit_text is None else int(limit_text)
    except ValueError:
        raise Problem(400, f"limit: {limit_text[:40]!r} is not a whole number") from None
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise Problem(400, f"limit: a page shows 1 to {MAX_PAGE_SIZE} messages, got {limit}")
    after = None
    after_at, after_id = one(params, "after_at"), one(params, "after_id")
    if (after_at is None) != (after_id is None):
        raise Problem(400, "after_at and after_id go together (the last row of the page "
                           "before)")
    if after_at is not None and after_id is not None:
        after = (moment("after_at", after_at), message_id(after_id))
    queue = one(params, "queue")
    if queue is not None and len(queue) > 1000:
        raise Problem(400, "queue: longer than any queue name")
    return ArchiveQuery(queue=queue, states=tuple(states) or None,
                        error_contains=one(params, "error"), archived_from=archived_from,
                        archived_to=archived_to, after=after, limit=limit)


def archive_params(query: ArchiveQuery, *, next_page: bool = False) -> list[tuple[str, str]]:
    """The query string of ``query`` (what :func:`archive_query` reads back); the filters
    only unless ``next_page``."""
    out: list[tuple[str, str]] = []
    if query.queue is not None:
        out.append(("queue", query.queue))
    out.extend(("state", s) for s in query.states or ())
    if query.error_contains:
        out.append(("error", query.error_contains))
    if query.archived_from is not None:
        out.append(("from", query.archived_from.isoformat()))
    if query.archived_to is not None:
        out.append(("to", query.archived_to.isoformat()))
    if query.limit != PAGE_SIZE:
        out.append(("limit", str(query.limit)))
    if next_page and query.after is not None:
        out += [("after_at", query.after[0].isoformat()), ("after_id", str(query.after[1]))]
    return out


def duration(name: str, text: str | None) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` (a bare number: days), as ``sqlmq purge
    --older-than`` reads them."""
    from ..cli.common import Duration

    if text is None:
        raise Problem(400, f"{name}: missing (a duration such as 7d, 12h or 30m)")
    try:
        return Duration("d").convert(text, None, None)
    except click.BadParameter as exc:
        raise Problem(400, f"{name}: {exc.message}") from None


# ---- figures --------------------------------------------------------------------------------


def age(seconds: float | None) -> str:
    """``4s``, ``3m 12s``, ``2h 05m``, ``3d 4h``: as precise as a glance needs."""
    if seconds is None:
        return "–"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def seconds(value: float | None) -> str:
    """A latency: milliseconds under a second, seconds under a minute, then an age."""
    if value is None:
        return "–"
    if value < 1:
        return f"{value * 1000:.0f} ms" if value >= 0.01 else f"{value * 1000:.1f} ms"
    if value < 60:
        return f"{value:.2f} s"
    return age(value)


def count(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def per_minute(n: int, window: str) -> str:
    rate = n / WINDOWS[window] * 60
    if rate == 0:
        return "0"
    return f"{rate:.1f}" if rate < 100 else f"{rate:,.0f}"


def when(value: datetime | None) -> str:
    """UTC to the second, as every page shows time (the tooltip has the microseconds)."""
    return "–" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def since(value: datetime | None, now: datetime) -> float | None:
    return None if value is None else (now - value).total_seconds()


def first_line(text: str | None, limit: int = 160) -> str:
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Payload:
    """A payload as a page shows it: ``kind`` is ``json`` (pretty-printed), ``text`` or
    ``binary`` (a hex dump); ``shown`` is cut at :data:`PAYLOAD_SHOWN` characters or bytes
    (``cut`` says so; the whole payload is a download)."""

    kind: str
    shown: str
    size: int
    cut: bool


#: Larger payloads are shown as their first characters, not parsed and pretty-printed.
PRETTY_LIMIT = 1024 * 1024


def payload(raw: bytes) -> Payload:
    try:
        text = raw.decode() if len(raw) <= PRETTY_LIMIT else _text_prefix(raw)
    except UnicodeDecodeError:
        text = None
    if text is None:
        part = raw[:PAYLOAD_SHOWN]
        return Payload("binary", hex_dump(part), len(raw), len(part) < len(raw))
    kind = "text"
    if len(raw) <= PRETTY_LIMIT:
        try:
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            kind = "json"
        except ValueError:
            pass
    return Payload(kind, text[:PAYLOAD_SHOWN], len(raw),
                   len(text) > PAYLOAD_SHOWN or len(raw) > PRETTY_LIMIT)


def kept_result(view: MessageView) -> Payload | None:
    """The result a subscriber kept for the message (``results=True``), shown as a payload
    is: pretty JSON, text or a hex dump; None: none kept."""
    parts = view.result_parts()
    return None if parts is None else payload(parts[1])


def _text_prefix(raw: bytes) -> str | None:
    """The start of a payload too large to pretty-print, as text; None: it is binary."""
    part = raw[:PAYLOAD_SHOWN]
    try:
        return part.decode()
    except UnicodeDecodeError as exc:
        if exc.start >= len(part) - 3 and exc.reason == "unexpected end of data":
            return part[:exc.start].decode()  # a character cut by the prefix
        return None


def hex_dump(data: bytes) -> str:
    """Offset, sixteen bytes in hex, and those that are printable ASCII."""
    lines = []
    for at in range(0, len(data), 16):
        chunk = data[at:at + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{at:08x}  {hexes:<47}  {text}")
    return "\n".join(lines)


HISTORY_KEYS = ("delivery", "ended", "at", "error")


def history_rows(history: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Each delivery's ending, its usual keys apart and anything else as JSON (a row a hand
    edit broke shows as it is)."""
    rows = []
    for entry in history:
        if not isinstance(entry, Mapping):
            entry = {"entry": entry}
        rest = {k: v for k, v in entry.items() if k not in HISTORY_KEYS}
        rows.append({k: "" if entry.get(k) is None else str(entry[k]) for k in HISTORY_KEYS}
                    | {"other": json.dumps(rest, default=str, ensure_ascii=False) if rest
                       else ""})
    return rows


# ---- JSON ----------------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def latency_json(latency: Latency | None) -> dict[str, float] | None:
    if latency is None:
        return None
    return {"count": latency.count, "p50": latency.p50, "p90": latency.p90,
            "p99": latency.p99, "max": latency.max}


COUNTS = ("pending", "processing", "retryable", "completed", "failed", "expired", "cancelled")


def overview_json(q: QueueOverview, paused: Mapping[str, PausedQueue]) -> dict[str, Any]:
    pause = paused.get(q.queue)
    return {
        "queue": q.queue, **{c: getattr(q.stats, c) for c in COUNTS},
        "dead": q.stats.failed + q.stats.cancelled,
        "oldest_ready_at": _iso(q.stats.oldest_ready_at),
        "oldest_ready_age": q.oldest_ready_age,
        "activity": {name: {"completed": w.completed, "failed": w.failed,
                            "cancelled": w.cancelled, "expired": w.expired,
                            "retried": w.retried,
                            "completed_per_second": w.completed / WINDOWS[name]}
                     for name, w in q.activity.items()},
        "latency": latency_json(q.latency),
        "paused": pause is not None,
        "paused_at": None if pause is None else _iso(pause.paused_at),
    }


def detail_json(d: QueueDetail, paused: Mapping[str, PausedQueue],
                now: datetime) -> dict[str, Any]:
    return overview_json(d.overview, paused) | {
        "deliveries": {str(n): c for n, c in sorted(d.deliveries.items())},
        "channels": [{"name": c.name, "waiting": c.waiting, "running": c.running,
                      "own_settings": c.settings is not None,
                      "max_concurrency": c.effective.max_concurrency,
                      "rate": c.effective.rate, "ordered": c.effective.ordered,
                      "max_size": c.effective.max_size,
                      "last_served_at": _iso(c.last_served_at)} for c in d.channels],
        "schedules": [{"name": s.name, "cadence": s.cadence.describe(),
                       "catch_up": s.catch_up, "last_tick_at": _iso(s.last_tick_at),
                       "last_message_id": s.last_message_id,
                       "next_tick_at": _iso(next_tick(s, now))} for s in d.schedules],
    }


def next_tick(schedule: Any, now: datetime) -> datetime | None:
    if schedule.paused:  # none until it is resumed
        return None
    try:
        return schedule.next_tick(now)
    except Exception:  # a cadence that has no next tick (a cron that never fires again)
        return None


def charts_json(buckets: list[Bucket], step: float,
                percentiles: list[tuple[float, float]]) -> dict[str, Any]:
    """What the queue page's charts draw: per-minute rates at each bucket's end (unix
    seconds), and the latency curve."""
    return {
        "throughput": charts.throughput(buckets, step),
        "latency": {"percentile": [p for p, _ in percentiles],
                    "seconds": [s for _, s in percentiles]},
    }


def archived_json(v: MessageView) -> dict[str, Any]:
    """A row of the archive list (the whole message is ``/api/messages/ID``)."""
    return {"id": v.id, "queue": v.queue, "state": v.state, "deliveries": v.deliveries,
            "attempts": v.attempts, "created_at": _iso(v.created_at),
            "archived_at": _iso(v.archived_at), "error": v.error}


def worker_json(w: WorkerInfo, now: datetime) -> dict[str, Any]:
    return {"id": w.id, "host": w.host, "pid": w.pid, "version": w.version,
            "started_at": _iso(w.started_at), "heartbeat_at": _iso(w.heartbeat_at),
            "heartbeat_age": since(w.heartbeat_at, now), "expires_at": _iso(w.expires_at),
            "subscribers": w.subscribers, "running": w.running, "held": w.held}


def paused_json(p: PausedQueue, now: datetime) -> dict[str, Any]:
    return {"queue": p.queue, "paused_at": _iso(p.paused_at),
            "paused_for": since(p.paused_at, now)}


__all__ = ["COUNTS", "MAX_PAGE_SIZE", "PAGE_SIZE", "PAYLOAD_SHOWN", "Payload", "Problem",
           "age", "archive_params", "archive_query", "archived_json", "charts_json", "count",
           "detail_json", "duration", "first_line", "hex_dump", "history_rows",
           "kept_result", "latency_json", "message_id", "moment", "one", "overview_json",
           "paused_json", "payload", "per_minute", "seconds", "since", "when", "worker_json"]
