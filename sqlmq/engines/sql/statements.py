"""Each database's statements, one module per database, as named constants.

The same operation has the same name in every module (``ACQUIRE``, ``SETTLE``, ``EXTEND``,
``RECOVER_EXPIRED``, ``INSERT`` …), so a reader compares them side by side. Parameters are
in the style of whatever runs the statement: ``$n`` for PostgreSQL (asyncpg, or SQLAlchemy's
asyncpg dialect through ``exec_driver_sql``), ``%s`` for statements sent straight to the
MySQL driver, ``:name`` for SQLite and for MySQL statements run through SQLAlchemy's
``text()``.

Table names (and a few constants such as ``{history_limit}``) are written as ``{m}``,
``{a}`` … and filled in once, by :func:`render`, when an engine is built: never per call.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...channels import BLOCKED, ORDERED_LOOKAHEAD, TURN_BITS
from ...records import HISTORY_LIMIT
from ...schema import Schema
from ...search import TEXT_LIMIT, UNSEARCHED_HEADER


def render(text: str, names: Mapping[str, object]) -> str:
    """``text`` with its ``{name}`` fields filled in: the one way statements are completed."""
    return text.format(**names)


def channel_fields(names: Mapping[str, object]) -> dict[str, object]:
    """``names`` and the fields of the channel statements: the fair key's parts
    (``{turn_mask}``, ``{blocked}``) and the ordered window's ``{lookahead}``."""
    return {**names, "turn_mask": (1 << TURN_BITS) - 1, "blocked": BLOCKED,
            "lookahead": ORDERED_LOOKAHEAD}


def search_fields(names: Mapping[str, object]) -> dict[str, object]:
    """``names`` and the fields of the archive's text search statements (see
    :mod:`sqlmq.search`): the header it leaves out and how much of a row it reads."""
    return {**names, "unsearched": UNSEARCHED_HEADER, "text_limit": TEXT_LIMIT}


def names_for(schema: Schema) -> dict[str, object]:
    """The fields every statement may use: the tables of ``schema``'s prefix, and the
    number of history entries a message keeps."""
    return {**schema.names, "history_limit": HISTORY_LIMIT}


def fair_kind(row: str) -> str:
    """A look at the channel of ``row`` (with a ``channel``), by its own settings or
    else its queue's default: 0 without limits, 1 ordered without other limits, 2 with a
    concurrency limit or a rate (the limited acquire's). Read by PostgreSQL's and
    MariaDB's passing settles, whose rows are results; a message row says it itself
    (:func:`fair_turn`)."""
    return f"""(SELECT CASE WHEN c.configured = 1 THEN
                CASE WHEN c.max_concurrency IS NOT NULL OR c.rate IS NOT NULL THEN 2
                     WHEN c.ordered <> 0 THEN 1 ELSE 0 END
            WHEN d.queue IS NULL THEN 0
            WHEN d.max_concurrency IS NOT NULL OR d.rate IS NOT NULL THEN 2
            WHEN d.ordered <> 0 THEN 1 ELSE 0 END
       FROM {{channel}} AS c LEFT JOIN {{channel_default}} AS d ON d.queue = c.queue
       WHERE c.name = {row}.channel)"""


def passing_limit() -> str:
    """The concurrency limit within which channel row ``c`` (its queue's default ``d``
    outer-joined) passes freed slots straight on, by its own settings or else the default;
    NULL unless that limit is its one limit (no rate, not ordered). The raw-SQL twin of
    ``sqlmq.channels.ChannelSettings.passes_slots``, shared by PostgreSQL's SETTLE_PASSING
    and MariaDB's PASS_ROOM."""
    return """CASE WHEN c.configured = 1
            THEN CASE WHEN c.rate IS NULL AND COALESCE(c.ordered, 0) = 0
                      THEN c.max_concurrency END
            ELSE CASE WHEN d.rate IS NULL AND COALESCE(d.ordered, 0) = 0
                      THEN d.max_concurrency END END"""


def fair_turn(hint: str = "", row_values: bool = False) -> str:
    """The fair acquire's condition on message ``f``: it is not an ordered channel's (its
    ``ordered`` mark, schema version 19), or nothing of its channel comes before it in key
    order (``fair_key``, then ``id``; in any state, so one running holds the rest back):
    probes of the index ``(channel, fair_key, id)``, which ``hint`` may name. A message
    with a key is in a channel without limits (:func:`.fair.rekey` takes the keys
    off when limits are set, under the channel's lock, as a publish gives them), so the
    row tells all: looking its channel up instead (:func:`fair_kind`) took two index
    probes a row, most of the time of a read through the followers of running heads
    (19,000 of them, PostgreSQL: 170-190 -> 70-105 ms). ``row_values``: one probe, by a
    row comparison, which PostgreSQL reads as one range of the index (500 heads taken:
    1 ms less than two probes); MariaDB reads it as the whole channel (``EXPLAIN``: a
    ``ref`` on the channel), so it gets two, the second for an equal key."""
    if row_values:
        before = f"""NOT EXISTS (
                SELECT 1 FROM {{m}} AS o {hint}
                WHERE o.channel = f.channel AND (o.fair_key, o.id) < (f.fair_key, f.id))"""
    else:
        before = f"""NOT EXISTS (
                SELECT 1 FROM {{m}} AS o {hint}
                WHERE o.channel = f.channel AND o.fair_key < f.fair_key)
            AND NOT EXISTS (
                SELECT 1 FROM {{m}} AS o {hint}
                WHERE o.channel = f.channel AND o.fair_key = f.fair_key AND o.id < f.id)"""
    return f"""(f.ordered = 0 OR ({before}))"""


def let_in(taken: str, which: str, hint: str = "", source: str | None = None,
           fence: str = "") -> str:
    """The update that lets in (takes ``{blocked}`` off the key of) the first blocked
    message of the channel of each row of ``taken`` (with ``channel``) for which ``which``
    holds, while fewer than ``{lookahead}`` wait behind that channel's head below
    ``{blocked}`` (``core_fair._short``). The raw-SQL twin of ``core_fair.promotion``,
    shared by PostgreSQL's ACQUIRE_FAIR and SETTLE_PASSING and MariaDB's FAIR_LET_IN;
    ``hint`` names the index ``(channel, fair_key, id)`` for the probes; ``source``: what
    ``taken`` is the name of, if not a table's or a CTE's; ``fence``: what keeps the
    inner derived table from being merged into the outer (PostgreSQL's ``OFFSET 0``).

    The first blocked message is looked for first: most channels have none, and that
    probe ends at once, where the count behind the head reads ``{lookahead} + 1``
    entries and the table rows of those the index cannot vouch for (PostgreSQL's
    ``EXPLAIN ANALYZE``, 500 heads of channels of 20 taken: 1.3 -> 0.6 ms)."""
    def first(column: str, channel: str, where: str, offset: str = "0") -> str:
        return f"""(SELECT {column} FROM {{m}} AS u {hint}
                WHERE u.channel = {channel} AND u.fair_key {where}
                ORDER BY u.fair_key, u.id LIMIT 1 OFFSET {offset})"""

    blocked = first("u.id", f"{taken}.channel", ">= {blocked}")
    nth = first("u.fair_key", "b.channel", "IS NOT NULL", "{lookahead}")
    return f"""
    UPDATE {{m}} AS p SET fair_key = p.fair_key - {{blocked}}
    WHERE p.fair_key >= {{blocked}} AND p.id IN (SELECT n.id FROM (
        SELECT b.id FROM (
            SELECT {blocked} AS id, {taken}.channel
            FROM {source or taken}
            WHERE {which}{fence}) AS b
        WHERE b.id IS NOT NULL AND COALESCE({nth}, {{blocked}}) >= {{blocked}}) AS n)"""


__all__ = ["fair_kind", "fair_turn", "let_in", "names_for", "passing_limit", "render"]
