"""The archive's text search (``Insights.search``, the dashboard's search box) on a large
archive: how long a search takes, and how long version 26 takes to index an archive it
finds.

Seeds ``--rows`` archived messages (1,000,000 by default) straight into the archive, in
one statement, before the search index exists: every row has a ``content-type`` header
(never searched); one in four also ``tenant: acme`` and a unique ``order: ord-<n>``; one in
fifty FAILED, with one of five error texts (one in five of those names a payment
gateway). Then it makes the index as the migration to version 26 does on such an archive
(timed: what an upgrade costs), runs ANALYZE, and times each search (the median of
``--rounds``, after one unmeasured run): a page of 50, newest first, rows decoded as the
dashboard gets them. Last, what the index costs the settle that archives a message
(``--archive`` messages, with the index and without it, three rounds).

Usage::

    .venv/bin/python -m bench.search --db postgresql [--rows 1000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

from sqlalchemy import text

from sqlmq import Broker, Outcome, Settlement

from .common import PREFIX, drop_tables, median, table, url_for

ERRORS = ("TimeoutError: payment gateway did not answer in 10 s (order ord-{g})",
          "ValueError: order ord-{g} has no shipping address",
          "HTTPError: 503 Service Unavailable from https://api.example.com/charge",
          "KeyError: sku A-{g} is not in the catalogue",
          "ConnectionRefusedError: [Errno 111] Connection refused")

#: (what is looked for, the search's text); the id is filled in from --rows.
SEARCHES = (("a message by id", "{middle}"),
            ("a word of one row", "ord-{rare}"),
            ("a word of 0.4% (gateway)", "gateway"),
            ("two words of 0.4%", "payment gateway"),
            ("a word of 25% (acme)", "acme"),
            ("a word's beginning, 0.4%", "serv"),
            ("no row", "zebra"))


def _seed_sql(kind: str, a: str, rows: int) -> str:
    """One statement that archives ``rows`` messages (see the module)."""
    if kind == "postgresql":
        errors = ", ".join("'" + e.replace("{g}", "' || g || '") + "'" for e in ERRORS)
        return f"""
        INSERT INTO {a} (id, queue, headers, payload, state, attempts_count,
                         deliveries_count, created_at, archived_at, error)
        SELECT g, 'q' || (g % 20),
               CASE WHEN g % 4 = 0 THEN jsonb_build_object('content-type', 'application/json',
                                            'tenant', 'acme', 'order', 'ord-' || g)
                    ELSE '{{"content-type": "application/json"}}'::jsonb END,
               '\\x7b7d'::bytea, CASE WHEN g % 50 = 0 THEN 'FAILED' ELSE 'COMPLETED' END, 1, 1,
               now() - ({rows} - g) * INTERVAL '3 milliseconds',
               now() - ({rows} - g) * INTERVAL '3 milliseconds',
               CASE WHEN g % 50 = 0 THEN (ARRAY[{errors}])[1 + (g / 50) % 5] END
        FROM generate_series(1, {rows}) AS g"""
    if kind == "mariadb":
        errors = ", ".join("CONCAT('" + e.replace("{g}", "', g, '") + "')" for e in ERRORS)
        return f"""
        INSERT INTO {a} (id, queue, headers, payload, state, attempts_count,
                         deliveries_count, created_at, archived_at, error)
        SELECT g, CONCAT('q', g % 20),
               IF(g % 4 = 0, JSON_OBJECT('content-type', 'application/json', 'tenant', 'acme',
                                         'order', CONCAT('ord-', g)),
                  JSON_OBJECT('content-type', 'application/json')),
               '{{}}', IF(g % 50 = 0, 'FAILED', 'COMPLETED'), 1, 1,
               UTC_TIMESTAMP(6) - INTERVAL ({rows} - g) * 3000 MICROSECOND,
               UTC_TIMESTAMP(6) - INTERVAL ({rows} - g) * 3000 MICROSECOND,
               IF(g % 50 = 0, ELT(1 + (g DIV 50) % 5, {errors}), NULL)
        FROM (SELECT seq AS g FROM seq_1_to_{rows}) AS s"""
    errors = " ".join(f"WHEN {i} THEN '" + e.replace("{g}", "' || g || '") + "'"
                      for i, e in enumerate(ERRORS))
    stamp = ("(strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', "
             f"-({rows} - g) * 0.003)) || '000')")
    return f"""
    WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {rows})
    INSERT INTO {a} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                     created_at, archived_at, error)
    SELECT g, 'q' || (g % 20),
           CASE WHEN g % 4 = 0 THEN json_object('content-type', 'application/json',
                                                'tenant', 'acme', 'order', 'ord-' || g)
                ELSE json_object('content-type', 'application/json') END,
           X'7b7d', CASE WHEN g % 50 = 0 THEN 'FAILED' ELSE 'COMPLETED' END, 1, 1,
           {stamp}, {stamp},
           CASE WHEN g % 50 = 0 THEN CASE (g / 50) % 5 {errors} END END
    FROM s"""


def _drop_index(conn: Any, a: str) -> None:
    """The archive as before version 26: no search index (so the seed does not keep it)."""
    kind = conn.dialect.name
    if kind == "postgresql":
        conn.exec_driver_sql(f"DROP INDEX ix_{a}_search")
    elif kind == "sqlite":
        conn.exec_driver_sql(f"DROP TABLE {a}_search")
        for trigger in ("insert", "delete", "update"):
            conn.exec_driver_sql(f"DROP TRIGGER {a}_search_{trigger}")
    else:
        conn.exec_driver_sql(f"ALTER TABLE {a} DROP INDEX ft_{a}_search, DROP COLUMN search_text")


async def run(db: str, rows: int, rounds: int) -> None:
    url = url_for(db)
    drop_tables(url)
    broker = Broker(url, table_prefix=PREFIX)
    try:
        await broker.migrate()
        a = broker.schema.archive.name
        kind = "mariadb" if db == "mariadb" else db
        async with broker.db.begin() as conn:
            await conn.run_sync(_drop_index, a)
        started = time.perf_counter()
        async with broker.db.begin() as conn:
            await conn.execute(text(_seed_sql(kind, a, rows)))
        seeded = time.perf_counter() - started
        make_index = broker.engine.database_steps()[26]  # type: ignore[attr-defined]
        started = time.perf_counter()
        async with broker.db.begin() as conn:
            await conn.run_sync(make_index, broker.schema)
        indexed = time.perf_counter() - started
        async with broker.db.begin() as conn:
            await conn.exec_driver_sql(f"ANALYZE TABLE {a}" if db == "mariadb"
                                       else f"ANALYZE {a}")
        print(f"{db}: {rows:,} archived rows seeded in {seeded:.1f} s; the search index "
              f"(version 26 on them) made in {indexed:.1f} s")
        results = []
        insights = broker.insights()
        for what, pattern in SEARCHES:
            query = pattern.format(middle=rows // 2, rare=(rows * 3 // 4) // 4 * 4)
            found = await insights.search(query)
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                await insights.search(query)
                times.append((time.perf_counter() - started) * 1000)
            shown = len(found.items) + (found.message is not None and not found.items)
            results.append((what, repr(query), shown, median(times), max(times)))
        print(table(f"\nsearch, {db}, {rows:,} archived rows (a page of 50, newest first)",
                    ["search", "text", "shown", "median ms", "max ms"], results))
    finally:
        await broker.close()
        drop_tables(url)


async def _archive_time(db: str, indexed: bool, searchable: bool, messages: int) -> float:
    """Microseconds of the engine's settle per message archived, on fresh tables with the
    search index or without it; ``searchable``: FAILED with an error and a header (what
    the index holds), else COMPLETED with only ``content-type`` (what it leaves out)."""
    url = url_for(db)
    drop_tables(url)
    broker = Broker(url, table_prefix=PREFIX)
    try:
        await broker.migrate()
        if not indexed:
            async with broker.db.begin() as conn:
                await conn.run_sync(_drop_index, broker.schema.archive.name)
        await broker.publish_batch("q", [{"i": i} for i in range(messages)],
                                   headers={"tenant": "acme"} if searchable else None)
        spent = 0.0
        while taken := await broker.engine.acquire(["q"], 500, 60):
            settled = [Settlement(d.id, d.deliveries,
                                  Outcome.FAIL if searchable else Outcome.COMPLETE,
                                  error=ERRORS[0].format(g=d.id) if searchable else None)
                       for d in taken]
            started = time.perf_counter()
            await broker.engine.settle(settled)
            spent += time.perf_counter() - started
        return spent / messages * 1e6
    finally:
        await broker.close()
        drop_tables(url)


async def archive_cost(db: str, messages: int, rounds: int) -> None:
    """What the index costs the settle that archives a message (batches of 500)."""
    rows = []
    for searchable in (False, True):
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for indexed in (True, False):
                times[indexed].append(await _archive_time(db, indexed, searchable, messages))
        rows.append(("FAILED, an error and a header" if searchable
                     else "COMPLETED, only content-type", median(times[False]),
                     median(times[True])))
    print(table(f"\narchiving {messages:,} messages, {db}: the settle's µs a message "
                f"(median of {rounds})", ["messages", "without index", "with index"], rows))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("postgresql", "mariadb", "sqlite"),
                        default="postgresql")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--archive", type=int, default=10_000,
                        help="messages archived to time the index's cost (0: skip)")
    args = parser.parse_args(argv)
    asyncio.run(run(args.db, args.rows, args.rounds))
    if args.archive:
        asyncio.run(archive_cost(args.db, args.archive, 3))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average {load}")
    print(f"reproduce: .venv/bin/python -m bench.search --db {args.db} --rows {args.rows} "
          f"--rounds {args.rounds} --archive {args.archive}")


if __name__ == "__main__":
    main(sys.argv[1:])
