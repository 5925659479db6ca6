"""PostgreSQL's statements. Parameters are asyncpg's ``$n``; every statement runs on asyncpg,
straight or through SQLAlchemy's ``exec_driver_sql`` (see :mod:`sqlmq.engines.postgresql.engine`).
Table names are filled in once by :func:`sqlmq.engines.sql.statements.render`.

Arrays travel as text literals (``'{1,2,3}'``) where the hot path sends them: the server
parses them in C, where the driver's array encoder would spend about a microsecond of Python
per element.
"""

from ...sqltime import pg_stamped
from ..sql.statements import fair_kind, fair_turn, let_in, passing_limit

# ---- publishing ------------------------------------------------------------------------------

# Publish a batch to one queue, due after $6 seconds: one statement, one round trip. The
# NOTIFY rides in the same statement, so it fires when (and only if) the transaction commits,
# on sqlmq's connection or the caller's (INSERT_QUIET, below, leaves it out). Headers go
# once per distinct set ($2, parsed to JSONB once) with each row's 1-based index into them
# ($3): parsing the JSON again for every row was a large part of the server's time. Returns
# one row: every new id, sorted.
# $1 queue, $2 header sets, $3 keys, $4 payloads (bytea array literal), $5 channel, $6 delay,
# $7 priority, $8 the moment it expires, else $9 seconds from now until it does (both NULL:
# never).
def _insert(due: str, woken: str) -> str:
    """The publishing INSERT, with the rows due at ``due``; ``woken``: what the statement's
    ``woken`` CTE selects (the NOTIFY, or only the channel, unused)."""
    return f"""
WITH inserted AS (
    INSERT INTO {{m}} (queue, headers, payload, state, attempts_count, deliveries_count,
                     created_at, next_attempt_at, priority, expires_at)
    SELECT $1, (h.hs)[u.k], u.p, 'PENDING', 0, 0, now(), {due}, CAST($7 AS INTEGER),
           COALESCE(CAST($8 AS TIMESTAMPTZ),
                    now() + CAST($9 AS DOUBLE PRECISION) * INTERVAL '1 second')
    FROM CAST(CAST(CAST($2 AS TEXT) AS TEXT[]) AS JSONB[]) AS h(hs),
        unnest(CAST(CAST($3 AS TEXT) AS INTEGER[]), CAST(CAST($4 AS TEXT) AS BYTEA[]))
        WITH ORDINALITY AS u(k, p, n)
    ORDER BY u.n
    RETURNING id
), woken AS MATERIALIZED (SELECT {woken})
SELECT array_agg(inserted.id ORDER BY inserted.id) FROM inserted, woken
"""


_AFTER_DELAY = "(now() + CAST($6 AS DOUBLE PRECISION) * INTERVAL '1 second')"
_AT_MOMENT = "CAST($6 AS TIMESTAMPTZ)"
_NOTIFY = "pg_notify($5, $1)"
# Without the NOTIFY (see sqlmq.engines.postgresql.wakes): $5 is still named, so that both forms
# take the same parameters (a parameter no statement names has no type to prepare with).
_QUIET = "CAST($5 AS TEXT)"

INSERT = _insert(_AFTER_DELAY, _NOTIFY)

# The same, due at the moment $6 (a timestamptz) instead of after a delay.
INSERT_AT = _insert(_AT_MOMENT, _NOTIFY)

# INSERT and INSERT_AT without their NOTIFY: a publish that overlaps another of the same
# process, whose wake-up is sent after its commit, with others (sqlmq.engines.postgresql.wakes).
INSERT_QUIET = _insert(_AFTER_DELAY, _QUIET)
INSERT_AT_QUIET = _insert(_AT_MOMENT, _QUIET)

# The wake-up of the quiet publishes to queues $2 (an array) on channel $1, in a transaction
# of its own: one notification per queue.
WAKE = "SELECT pg_notify($1, q) FROM unnest(CAST($2 AS TEXT[])) AS q"

# The id column's sequence, from which a COPY reserves its ids. $1 the message table.
COPY_SEQUENCE = "SELECT pg_get_serial_sequence($1, 'id')"

# Run before a large batch's binary COPY, in its transaction: reserve $1 ids from the id
# sequence (spliced in as a literal, {sequence}, so it resolves once, at parse time), read
# the clock the rows take (created_at, the schedule: at $2, or now + $3 seconds, and the
# expiry: at $6, or now + $7 seconds, or NULL), and queue the NOTIFY ($4 channel, $5 queue),
# which fires at COMMIT, once the rows are visible.
COPY_RESERVE = """
SELECT now(), COALESCE(CAST($2 AS TIMESTAMPTZ),
                       now() + CAST($3 AS DOUBLE PRECISION) * INTERVAL '1 second'),
       ARRAY(SELECT nextval({sequence}) FROM generate_series(1, CAST($1 AS INTEGER))),
       pg_notify($4, $5),
       COALESCE(CAST($6 AS TIMESTAMPTZ),
                now() + CAST($7 AS DOUBLE PRECISION) * INTERVAL '1 second')
"""

# ---- dead letters ----------------------------------------------------------------------------

# The payload of a dead letter's NOTIFY, as an expression over a row with ``id``, ``queue``
# and ``outcome`` (its state): JSON text, ``{"id" : 7, "queue" : "orders", "state" :
# "FAILED"}``, never the body, so it stays far below PostgreSQL's 8000 bytes (see
# DEAD_LETTER_PAYLOAD_MOST in sqlmq.engines.postgresql.notify). SETTLE sends it for its FAILED rows;
# sqlmq.engines.postgresql.engine (_dead_letter_statement) sends it, over a Core subquery with those
# three columns, for a row core_control archives CANCELLED.
DEAD_LETTER_PAYLOAD = "CAST(json_build_object('id', id, 'queue', queue, 'state', outcome) AS TEXT)"

# ---- consuming -------------------------------------------------------------------------------

# The write every acquire ends with: the rows of ``ready`` (id, next_attempt_at) leased for $3
# seconds, returned with their ready time (times as epoch seconds, JSON as text: decoded once
# per distinct value) and what defer and cancellation left on them (schema version 9).
# ``now()`` is the statement's time: a floor learns from it (see ACQUIRE_ABOVE_FLOORS).
def _take(cleared: str, more: str = "", lease: str = "$3",
          by: str = "m.id = ready.id AND m.id = ANY(ARRAY(SELECT id FROM ready))") -> str:
    """The take of ``ready``'s rows, clearing their due column ``cleared``; ``more``: columns
    returned after the usual ones; ``lease``: the parameter of the lease's seconds; ``by``:
    the join of ``ready`` to the table."""
    return f"""
UPDATE {{m}} AS m SET
    state = 'PROCESSING',
    deliveries_count = m.deliveries_count + 1,
    acquired_at = now(),
    first_attempt_at = COALESCE(m.first_attempt_at, now()),
    {cleared} = NULL,
    lease_expires_at = now() + CAST({lease} AS DOUBLE PRECISION) * INTERVAL '1 second'
FROM ready
WHERE {by}
RETURNING m.id, m.queue, CAST(m.headers AS TEXT), m.payload, m.attempts_count,
    m.deliveries_count, date_part('epoch', m.created_at), date_part('epoch', m.first_attempt_at),
    date_part('epoch', m.acquired_at), date_part('epoch', m.lease_expires_at),
    date_part('epoch', ready.next_attempt_at), CAST(m.history AS TEXT), m.priority,
    date_part('epoch', m.expires_at), m.saved_state, m.defers_count, m.cancel_requested{more}
"""


_TAKE = _take("next_attempt_at")

# Acquire up to $2 due messages of the channels without limits in queues $1 (an array), in
# their fair order (schema version 13, see sqlmq.channels) below BLOCKED, an ordered
# channel's only while nothing of its comes before them (schema version 14), leased for $3
# seconds, returned as ACQUIRE returns them with their channel, key and whether the
# channel is ordered last; move each queue's clock on to the lowest turn taken (the low
# TURN_BITS of fair_key), never back; and let in the next message of each ordered channel
# whose head was taken, if its window is short. Whether a row's channel is ordered is
# read from the row (schema version 19), not from the channel's settings: the fair index
# is read in order until $2 rows are found, and a lookup per row read was most of the
# time of a read through the followers of running heads. The same conditions as SQLite's
# and MariaDB's FAIR_PICK (fair_turn, shared with theirs; here its one-probe form, a row
# comparison).
# One ordered read per queue (LATERAL): with queue = ANY($1), the index gives no order and
# the whole backlog was sorted (115 ms for 20,000 rows). The take joins ready to the table
# as the plain ACQUIRE's does, by id and by the ANY(...) of ready's ids: by id alone, once
# the planner expected as many rows from ready as asked (no longer discounted for a
# per-row lookup of the channel), it merge-joined them to the primary key read from its
# start to the highest id taken (with sequential scans allowed, it hashed one of the whole
# table: 5 ms of 10 for 500 rows of 20,000). Expecting one row (statistics of an empty
# table), it probes the table by both conditions at once (9 µs a row). (With the lookup,
# under other statistics, it once probed by the whole list per row of ready: 125,000 rows
# for 500.)
ACQUIRE_FAIR = """
WITH ready AS (
    SELECT r.* FROM unnest($1::text[]) AS q(name) CROSS JOIN LATERAL (
        SELECT f.id, f.channel_due_at AS next_attempt_at, f.queue, f.fair_key, f.channel,
               f.ordered = 1 AS ordered
        FROM {m} AS f
        WHERE f.queue = q.name AND f.fair_key IS NOT NULL AND f.fair_key < {blocked}
          AND f.channel_due_at <= now()
          AND f.state IN ('PENDING', 'RETRYABLE')
          AND """ + fair_turn(row_values=True) + """
        ORDER BY f.fair_key, f.id
        LIMIT $2
        FOR UPDATE OF f SKIP LOCKED
    ) AS r
    WHERE q.name NOT IN (SELECT queue FROM {pause})
    ORDER BY r.fair_key, r.id
    LIMIT $2
), clock AS (
    INSERT INTO {channel_clock} (queue, turn)
    SELECT queue, min(fair_key & {turn_mask}) FROM ready GROUP BY queue
    ON CONFLICT (queue) DO UPDATE SET turn = EXCLUDED.turn
    WHERE {channel_clock}.turn < EXCLUDED.turn
), let_in AS (""" + let_in("ready", "ready.ordered", fence=" OFFSET 0") + """)
""" + _take("channel_due_at", ",\n    m.channel, ready.fair_key, ready.ordered")

# Queue $1 is not paused (schema version 11: a row in {pause}). Not a condition on each row:
# the planner makes it a one-time filter above the scans (one probe of the pause table's
# primary key), so a paused queue's backlog is not read at all, and a queue that is not
# paused pays one index probe per acquire.
_NOT_PAUSED = "NOT EXISTS (SELECT 1 FROM {pause} WHERE queue = $1)"

# Acquire up to $2 ready messages of queue $1, highest priority first, then in ready order,
# leased for $3 seconds, returned with their ready time (times as epoch seconds, JSON as
# text: decoded once per distinct value).
# The ready index is in this order, but a scan of it from the start would step over every
# entry of a higher priority that is not due yet (a retried or delayed message) before the
# ready ones of lower priorities: 80 ms per acquire behind a million delayed entries. So the
# priorities present are found first, one index descent each, highest first (``levels``:
# PostgreSQL has no skip scan before version 18), and each level's ready entries are read
# as one range, which ends at its first entry not due; the levels are visited only until
# $2 rows are found. With one priority in use, that is one descent more than a plain scan.
# The second condition on m.id is for the planner: without it, a ready CTE of a few hundred
# rows is hash-joined to a sequential scan of the whole backlog; with it, the rows are
# fetched by primary key.
ACQUIRE = """
WITH RECURSIVE levels(p) AS (
    (SELECT priority FROM {m} WHERE queue = $1 AND next_attempt_at IS NOT NULL
     ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT priority FROM {m} WHERE queue = $1 AND next_attempt_at IS NOT NULL
              AND priority < l.p
            ORDER BY priority DESC LIMIT 1)
    FROM levels AS l WHERE l.p IS NOT NULL
), ready AS (
    SELECT r.id, r.next_attempt_at FROM levels AS l CROSS JOIN LATERAL (
        SELECT id, next_attempt_at FROM {m}
        WHERE queue = $1 AND priority = l.p AND next_attempt_at <= now()
        ORDER BY next_attempt_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ) AS r
    WHERE """ + _NOT_PAUSED + """
    LIMIT $2
)
""" + _TAKE

# ACQUIRE, told what earlier acquires proved: $4 the priority levels known to the caller,
# $5 for each a floor (epoch seconds, or -Infinity) below which its ready entries were all
# taken. Why: while a session holds a snapshot open, the index entries of consumed messages
# cannot be removed, and ACQUIRE reads every one of them twice, from the start of the queue's
# section (the level probe, then the range): 53 ms behind 300,000 (``bench.dead_entries``).
# Here a known level is not probed but stepped over (the probe only searches the gaps between
# known levels, whose ranges are empty unless a new level appeared), and its range starts at
# its floor. A level found in a gap has no floor. Rows that become ready below a floor (a
# transaction that published with its start time and committed late; rows a concurrent
# acquire skipped and then released by rolling back) are found by SWEEP_BELOW_FLOORS, which
# the engine runs now and then on another connection (see sqlmq.engines.postgresql.floors).
ACQUIRE_ABOVE_FLOORS = """
WITH RECURSIVE known(p, f) AS MATERIALIZED (
    SELECT * FROM unnest(CAST($4 AS INTEGER[]), CAST($5 AS DOUBLE PRECISION[]))
), levels(p, f) AS (
    SELECT n.p, COALESCE((SELECT f FROM known WHERE known.p = n.p), '-Infinity')
    FROM (SELECT GREATEST(
        (SELECT max(p) FROM known),
        (SELECT priority FROM {m} WHERE queue = $1 AND next_attempt_at IS NOT NULL
           AND priority > COALESCE((SELECT CAST(max(p) AS BIGINT) FROM known), -2147483649)
         ORDER BY priority DESC LIMIT 1)) AS p OFFSET 0) AS n
    WHERE n.p IS NOT NULL
    UNION ALL
    SELECT n.p, COALESCE((SELECT f FROM known WHERE known.p = n.p), '-Infinity')
    FROM levels AS l CROSS JOIN LATERAL (SELECT GREATEST(
        (SELECT max(p) FROM known WHERE p < l.p),
        (SELECT priority FROM {m} WHERE queue = $1 AND next_attempt_at IS NOT NULL
           AND priority < l.p AND priority > COALESCE(
               (SELECT CAST(max(p) AS BIGINT) FROM known WHERE p < l.p), -2147483649)
         ORDER BY priority DESC LIMIT 1)) AS p OFFSET 0) AS n
    WHERE n.p IS NOT NULL
), ready AS (
    SELECT r.id, r.next_attempt_at FROM levels AS l CROSS JOIN LATERAL (
        SELECT id, next_attempt_at FROM {m}
        WHERE queue = $1 AND priority = l.p AND next_attempt_at >= to_timestamp(l.f)
          AND next_attempt_at <= now()
        ORDER BY next_attempt_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ) AS r
    WHERE """ + _NOT_PAUSED + """
    LIMIT $2
)
""" + _TAKE

# For each known level $2 of queue $1, its first ready entry below its floor $3 (epoch
# seconds; NULL when there is none): what ACQUIRE_ABOVE_FLOORS cannot see. It reads what
# ACQUIRE would (every entry below the floor, the dead ones too), but on a connection of its
# own, once a second, not on the fetch loop's path. No lock: a row found that a concurrent
# acquire is taking only costs the next acquire one longer scan.
SWEEP_BELOW_FLOORS = """
SELECT k.p, date_part('epoch', (
    SELECT next_attempt_at FROM {m}
    WHERE queue = $1 AND priority = k.p AND next_attempt_at < to_timestamp(k.f)
    ORDER BY next_attempt_at, id LIMIT 1))
FROM unnest(CAST($2 AS INTEGER[]), CAST($3 AS DOUBLE PRECISION[])) AS k(p, f)
"""

# The same for several queues: $1 is a text array of queue names, those paused left out
# before any is read (OFFSET 0 keeps that a primary-key probe per queue, not a join to the
# pause table the planner would hash). Each queue is read as
# ACQUIRE reads one (LATERAL: its priority levels, then each level's ready range), up to $2
# rows each; only those, at most $2 per queue, are sorted into one order. A single scan of
# queue = ANY($1) cannot give that order: it sorted every ready row of the queues on each
# acquire (400 ms at a million rows). A queue's rows beyond the first $2 overall stay
# locked only until this statement commits.
ACQUIRE_QUEUES = """
WITH ready AS (
    SELECT r.id, r.next_attempt_at
    FROM (SELECT DISTINCT name FROM unnest(CAST($1 AS TEXT[])) AS u(name)
          WHERE NOT EXISTS (SELECT 1 FROM {pause} AS p WHERE p.queue = u.name OFFSET 0)) AS q
    CROSS JOIN LATERAL (
        WITH RECURSIVE levels(p) AS (
            (SELECT priority FROM {m} WHERE queue = q.name AND next_attempt_at IS NOT NULL
             ORDER BY priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT priority FROM {m} WHERE queue = q.name AND next_attempt_at IS NOT NULL
                      AND priority < l.p
                    ORDER BY priority DESC LIMIT 1)
            FROM levels AS l WHERE l.p IS NOT NULL
        )
        SELECT s.id, s.priority, s.next_attempt_at FROM levels AS l CROSS JOIN LATERAL (
            SELECT id, priority, next_attempt_at FROM {m}
            WHERE queue = q.name AND priority = l.p AND next_attempt_at <= now()
            ORDER BY next_attempt_at, id
            LIMIT $2
            FOR UPDATE SKIP LOCKED
        ) AS s
        LIMIT $2
    ) AS r
    ORDER BY r.priority DESC, r.next_attempt_at, r.id
    LIMIT $2
)
""" + _TAKE

# Settle a batch in one round trip: archive (COMPLETED, FAILED), retry (RETRYABLE after a
# delay) or release (PENDING now). Every branch is fenced on (id, deliveries, PROCESSING);
# the ids returned are the writes that landed, anything else was stale.
# ``locked`` takes the batch's row locks first, all of them (the count is a one-time filter
# of both writes) and in id order, as EXTEND does: a flush and a lease renewal of the same
# rows locking them in different orders deadlocked.
# $1 ids, $2 deliveries, $3 outcomes, $4 errors, $5 delays, $6 refunds, $7 attempted,
# $8 new histories (NULL: unchanged; their newest entry gets the statement's time), $9 keep
# (0: delete instead of archiving, the subscriber's archive= setting), $11 answers (1: a
# caller may wait for its ending): array literals, one element per settlement (or NULL:
# none); $10 the results a subscriber keeps (results=True), a bytea array (NULL: none).
# ``archived`` writes a COMPLETED row's result with it: kept by the statement that archives
# the message, so only a settlement that lands keeps one (see sqlmq.results).
# ``dead`` sends the dead-letter NOTIFY of each FAILED row that landed (kept or deleted
# alike: a dead letter either way; see sqlmq.engines.postgresql.notify) on channel {dead_channel}
# (a literal, filled in by the engine): in this transaction, so it is delivered at the
# COMMIT and never for a stale result, which ``done`` does not hold. A CTE that no one reads
# is not run, so ``archived`` reads its count, as a one-time filter (an InitPlan run once,
# before the INSERT's first row, whatever the batch). For a batch without FAILED rows that is
# one more pass over the rows ``done`` already holds in memory, no NOTIFY. ``told`` likewise
# sends the NOTIFY on {result_channel} of the rows that landed with answers = 1, their ids
# joined by commas, a few hundred a notification (within PostgreSQL's 8000 bytes), which
# callers waiting for results LISTEN to (sqlmq.results.watch).
SETTLE = """
WITH i AS (
    SELECT * FROM unnest(
        CAST(CAST($1 AS TEXT) AS BIGINT[]), CAST(CAST($2 AS TEXT) AS INTEGER[]),
        CAST(CAST($3 AS TEXT) AS TEXT[]), CAST(CAST($4 AS TEXT) AS TEXT[]),
        CAST(CAST($5 AS TEXT) AS DOUBLE PRECISION[]),
        CAST(CAST($6 AS TEXT) AS INTEGER[]), CAST(CAST($7 AS TEXT) AS INTEGER[]),
        CAST(CAST($8 AS TEXT) AS TEXT[]), CAST(CAST($9 AS TEXT) AS INTEGER[]),
        CAST($10 AS BYTEA[]), CAST(CAST($11 AS TEXT) AS INTEGER[])
    ) AS i(id, deliveries, outcome, error, delay, refund, attempt, history, keep, result,
           answers)
),
locked AS MATERIALIZED (
    SELECT id FROM {m} WHERE id = ANY(CAST(CAST($1 AS TEXT) AS BIGINT[]))
    ORDER BY id FOR UPDATE
),
done AS (
    DELETE FROM {m} AS m USING i
    WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
      AND i.outcome IN ('COMPLETED', 'FAILED', 'EXPIRED') AND (SELECT count(*) FROM locked) >= 0
    RETURNING m.id, m.queue, m.headers, m.payload, m.attempts_count, m.deliveries_count,
        m.created_at, m.first_attempt_at, m.last_attempt_at, m.history AS old_history,
        m.priority, m.channel, i.outcome, i.error, i.attempt, i.history AS new_history, i.keep,
        i.result, i.answers
),
dead AS MATERIALIZED (
    SELECT pg_notify({dead_channel}, """ + DEAD_LETTER_PAYLOAD + """)
    FROM done WHERE outcome = 'FAILED'
),
told AS MATERIALIZED (
    SELECT pg_notify({result_channel}, string_agg(CAST(id AS TEXT), ','))
    FROM (SELECT id, (row_number() OVER ()) / 350 AS part FROM done WHERE answers = 1) AS t
    GROUP BY part
),
archived AS (
    INSERT INTO {a} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                     created_at, first_attempt_at, last_attempt_at, archived_at, error, history,
                     priority, channel, result)
    SELECT id, queue, headers, payload, outcome, attempts_count + attempt, deliveries_count,
           created_at, first_attempt_at,
           CASE WHEN attempt = 1 THEN now() ELSE last_attempt_at END, now(), error,
           COALESCE(""" + pg_stamped("new_history") + """, old_history), priority, channel,
           CASE WHEN outcome = 'COMPLETED' THEN result END
    FROM done WHERE keep = 1 AND (SELECT count(*) FROM dead) >= 0
      AND (SELECT count(*) FROM told) >= 0
    RETURNING id
),
moved AS (
    UPDATE {m} AS m SET
        state = CASE WHEN i.outcome = 'RETRY' THEN 'RETRYABLE' ELSE 'PENDING' END,
        attempts_count = m.attempts_count + i.attempt,
        -- a refunded first delivery (handed back unstarted) leaves no times behind
        first_attempt_at = CASE WHEN m.deliveries_count = i.refund THEN NULL
                                ELSE m.first_attempt_at END,
        acquired_at = CASE WHEN m.deliveries_count = i.refund THEN NULL ELSE m.acquired_at END,
        deliveries_count = m.deliveries_count - i.refund,
        last_attempt_at = CASE WHEN i.attempt = 1 THEN now() ELSE m.last_attempt_at END,
        next_attempt_at = CASE WHEN m.channel IS NULL
                               THEN now() + i.delay * INTERVAL '1 second' END,
        channel_due_at = CASE WHEN m.channel IS NOT NULL
                              THEN now() + i.delay * INTERVAL '1 second' END,
        lease_expires_at = NULL,
        last_error = COALESCE(i.error, m.last_error),
        history = COALESCE(""" + pg_stamped("i.history") + """, m.history)
    FROM i
    WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
      AND i.outcome IN ('RETRY', 'RELEASE') AND (SELECT count(*) FROM locked) >= 0
    RETURNING m.id
)
SELECT id FROM archived UNION ALL SELECT id FROM done WHERE keep = 0
UNION ALL SELECT id FROM moved
"""

# SETTLE, and the slots its results free passed on in the same statement (see
# sqlmq.engines.sql.slots): $12 gives each result's channel where its delivery held a slot
# (NULL elsewhere), $13 the subscriber's queues, $14 the lease, $15 the most messages to
# start. Each channel with only a concurrency limit starts as many of its due messages as
# results of it landed, within the limit; no channel lock is needed, as the channel's
# running count never grows. The statement's snapshot still sees the landed deliveries
# running, so the room left is the limit less the count plus what landed (a limited
# channel's messages have no fair_key: saying so lets the read use the limited channels'
# pick index, partial on it since schema version 17, and the count the running
# deliveries' index, partial on it since 18). Each ordered channel without other limits
# whose head this archives starts its next message in key order (ACQUIRE_FAIR's
# order), if it waits, is due and is not blocked: the first of the channel's rows but the
# archived ones (which the snapshot still sees), one probe of the index (channel,
# fair_key, id); and lets the next one in as the fair take of a head does.
# (A head put back to retry is still the first: nothing passes it.) No other process can
# start that message meanwhile: until this commits, its head comes before it. The take
# checks each row waits, all the same. One row per message started (or one with NULLs),
# each led by the ids that landed, then the row as ACQUIRE returns it and its channel.
SETTLE_PASSING = SETTLE.rsplit("SELECT id FROM archived", 1)[0] + """, landed AS (
    SELECT id FROM archived UNION ALL SELECT id FROM done WHERE keep = 0
    UNION ALL SELECT id FROM moved
), held AS (
    SELECT s.id, s.channel
    FROM unnest(CAST(CAST($1 AS TEXT) AS BIGINT[]), CAST(CAST($12 AS TEXT) AS TEXT[]))
        AS s(id, channel)
    WHERE s.channel IS NOT NULL
), freed AS (
    SELECT channel, count(*) AS n FROM held WHERE id IN (SELECT id FROM landed)
    GROUP BY channel
), room AS (
    SELECT f.channel, LEAST(f.n, lim.most - lim.running + f.n) AS n
    FROM freed AS f CROSS JOIN LATERAL (
        SELECT """ + passing_limit() + """ AS most,
               (SELECT count(*) FROM {m} AS r
                WHERE r.channel = f.channel AND r.fair_key IS NULL
                  AND r.state = 'PROCESSING') AS running
        FROM {channel} AS c LEFT JOIN {channel_default} AS d ON d.queue = c.queue
        WHERE c.name = f.channel
    ) AS lim
    WHERE lim.most IS NOT NULL
), passed AS (
    SELECT r.id, r.next_attempt_at, room.channel FROM room CROSS JOIN LATERAL (
        SELECT n.id, n.channel_due_at AS next_attempt_at FROM {m} AS n
        WHERE n.channel = room.channel AND n.state IN ('PENDING', 'RETRYABLE')
          AND n.queue = ANY($13::text[]) AND n.channel_due_at <= now()
          AND n.fair_key IS NULL AND n.queue NOT IN (SELECT queue FROM {pause})
        ORDER BY n.priority DESC, n.channel_due_at, n.id
        LIMIT GREATEST(room.n, 0)
        FOR UPDATE SKIP LOCKED
    ) AS r
    LIMIT $15
), heads AS (
    SELECT DISTINCT h.channel FROM held AS h
    WHERE h.id IN (SELECT id FROM done) AND """ + fair_kind("h") + """ = 1
), following AS (
    SELECT n.id, n.channel_due_at AS next_attempt_at, heads.channel
    FROM heads CROSS JOIN LATERAL (
        SELECT o.id, o.state, o.channel_due_at, o.fair_key, o.queue
        FROM {m} AS o
        WHERE o.channel = heads.channel AND o.fair_key IS NOT NULL
          AND o.id NOT IN (SELECT id FROM done)
        ORDER BY o.fair_key, o.id
        LIMIT 1
    ) AS n
    WHERE n.state IN ('PENDING', 'RETRYABLE') AND n.fair_key < {blocked}
      AND n.channel_due_at <= now() AND n.queue = ANY($13::text[])
      AND n.queue NOT IN (SELECT queue FROM {pause})
), ready AS (
    SELECT * FROM (SELECT * FROM passed UNION ALL SELECT * FROM following) AS r LIMIT $15
), let_in AS (""" + let_in("following", "true", fence=" OFFSET 0") + """
), taken AS (""" + _take("channel_due_at", ",\n    m.channel", lease="$14",
                        by="m.id = ready.id AND m.state IN ('PENDING', 'RETRYABLE')") + """)
SELECT (SELECT array_agg(id) FROM landed), taken.* FROM (SELECT 1) AS one
LEFT JOIN taken ON true
"""

# How messages $1 (ids) stand for callers waiting on them (sqlmq.results): the archive's
# state, kept result and error, else the message table's state; one statement, so one
# snapshot (a message archived or requeued meanwhile shows on one side, never on neither).
ANSWERS = """
SELECT id, state, result, error, 1 FROM {a} WHERE id = ANY(CAST($1 AS BIGINT[]))
UNION ALL
SELECT id, state, NULL, NULL, 0 FROM {m} WHERE id = ANY(CAST($1 AS BIGINT[]))
"""

# Push the leases of held deliveries ($1 ids, $2 deliveries, sorted by id) to now + $3
# seconds; returns the ids still held. Locks its rows in id order first, as SETTLE does.
EXTEND = """
WITH locked AS MATERIALIZED (
    SELECT id FROM {m} WHERE id = ANY(CAST($1 AS BIGINT[])) ORDER BY id FOR NO KEY UPDATE
)
UPDATE {m} AS m
SET lease_expires_at = now() + CAST($3 AS DOUBLE PRECISION) * INTERVAL '1 second'
FROM unnest(CAST($1 AS BIGINT[]), CAST($2 AS INTEGER[])) AS i(id, deliveries)
WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
  AND (SELECT count(*) FROM locked) >= 0
RETURNING m.id
"""

# ---- maintenance -----------------------------------------------------------------------------

# One recoverer at a time ($1 the lock's name): held until the recovering transaction ends,
# so a crashed recoverer cannot keep it. False: another process is recovering.
RECOVERY_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext($1))"

# Return up to $1 messages whose lease expired to PENDING, each ready within $2 seconds at
# random, recording the expiry in their history (which keeps its newest entries).
RECOVER_EXPIRED = """
UPDATE {m} AS m SET
    state = 'PENDING',
    next_attempt_at = CASE WHEN m.channel IS NULL THEN
        now() + random() * CAST($2 AS DOUBLE PRECISION) * INTERVAL '1 second' END,
    channel_due_at = CASE WHEN m.channel IS NOT NULL THEN
        now() + random() * CAST($2 AS DOUBLE PRECISION) * INTERVAL '1 second' END,
    lease_expires_at = NULL,
    last_error = 'lease expired',
    history = (
        SELECT COALESCE(jsonb_agg(e ORDER BY o), '[]'::jsonb) FROM (
            SELECT e, o FROM jsonb_array_elements(
                COALESCE(m.history, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                    'delivery', m.deliveries_count, 'ended', 'lease_expired',
                    'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')
                ))
            ) WITH ORDINALITY AS x(e, o)
            ORDER BY o DESC LIMIT {history_limit}
        ) AS kept
    )
WHERE m.id IN (
    SELECT id FROM {m}
    WHERE lease_expires_at < now() AND state = 'PROCESSING'
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
RETURNING m.id
"""

# Concurrent migrators of one prefix ($1) take turns; released at the end of the transaction.
MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(hashtext($1))"

# ---- session settings --------------------------------------------------------------------------

# Set on the connections acquire and settle run on, so that their plans do not depend on the
# table's statistics. A new table has none, or those of an empty table, and the planner then
# reads the whole table on every call: a sequential scan (and a sort), or a bitmap scan of
# every index entry of the queue, dead ones included. A prepared statement keeps such a
# generic plan until the first autovacuum ANALYZE, a minute or more into the load (measured:
# acquire from 0.2 to 400 ms at 67k dead tuples). Without these paths what is left reads the
# ready index in acquire order and the primary key by id (acquire's second condition on m.id
# bounds that side whatever the join order). Joins stay free: without hash joins, acquire's
# join took 30 ms instead of 1.4 for 500 rows. Left open: from an empty table's statistics,
# settle may still walk the whole primary key index as the outer side of its join.
# And generic plans, always: left to choose, PostgreSQL planned acquire afresh at every call
# (its generic plan's estimate, with LIMIT and the arrays unknown, never beat the custom
# ones'), 0.44 ms of planning in a 0.7 ms acquire of one message; with the paths above off,
# the generic plan is the custom one. A lone acquire 0.77 -> 0.52 ms; drains unchanged.
INDEX_PLANS_ON = ("SET enable_seqscan = off; SET enable_bitmapscan = off; "
                  "SET plan_cache_mode = force_generic_plan")

# Put back before a kept connection returns to the pool, whose other users expect defaults.
INDEX_PLANS_OFF = "RESET enable_seqscan; RESET enable_bitmapscan; RESET plan_cache_mode"


# ---- the Spark source and sink (run by sqlmq/engines/spark/) -------------------------------
# Table names are filled by ``render(text, names)`` (``str.format``): ``{m}`` message, ``{a}``
# archive, ``{spark_lease}``, ``{spark_staging}``. Parameters are ``$n``, as in the engine's
# statements (which the stream's lease embeds): the Spark side runs them on the synchronous
# driver, psycopg, with its raw cursor, which takes PostgreSQL's own placeholders. Each name
# exists on every database where the operation does.

# the stream

#: Lease sequence ``$5`` of consumer ``$4``: the engine's own :data:`ACQUIRE` (queue ``$1``,
#: up to ``$2`` messages, ``$3`` seconds) feeding the lease rows, in one statement: the
#: messages never travel to the client. Returns ``(id, deliveries, attempts)`` of each
#: message leased.
SPARK_LEASE = "WITH acquired AS (" + ACQUIRE + """),
leased AS (
    INSERT INTO {spark_lease} (consumer, seq, id, deliveries, attempts)
    SELECT $4, $5, id, deliveries_count, attempts_count FROM acquired
    RETURNING id, deliveries, attempts
)
SELECT id, deliveries, attempts FROM leased
"""

#: Acknowledge sequences ``<= $2`` of consumer ``$1``: the engine's settle of
#: Outcome.COMPLETE (fenced on id, delivery and PROCESSING; one attempt; the history
#: unchanged), fed by the lease rows it deletes. Returns how many lease rows there were and
#: how many messages were archived (the others had lost their lease).
SPARK_ACKNOWLEDGE = """
WITH l AS (
    DELETE FROM {spark_lease} WHERE consumer = $1 AND seq <= $2
    RETURNING id, deliveries
),
done AS (
    DELETE FROM {m} AS m USING l
    WHERE m.id = l.id AND m.deliveries_count = l.deliveries AND m.state = 'PROCESSING'
    RETURNING m.id, m.queue, m.headers, m.payload, m.attempts_count, m.deliveries_count,
        m.created_at, m.first_attempt_at, m.history, m.priority
),
archived AS (
    INSERT INTO {a} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                     created_at, first_attempt_at, last_attempt_at, archived_at, error, history,
                     priority)
    SELECT id, queue, headers, payload, 'COMPLETED', attempts_count + 1, deliveries_count,
           created_at, first_attempt_at, now(), now(), NULL, history, priority
    FROM done
    RETURNING 1
)
SELECT (SELECT count(*) FROM l), (SELECT count(*) FROM archived)
"""

#: The leased messages ``$1`` (an array literal of ids), in the order given. A message is in
#: exactly one of the two tables in the statement's snapshot (settling moves it in one
#: statement), so the UNION ALL returns each id once. Headers come as JSON text, timestamps as
#: integer microseconds since the epoch (Arrow takes those as they are).
SPARK_READ_LEASED = """
WITH w AS (SELECT id, o FROM unnest(CAST(CAST($1 AS TEXT) AS BIGINT[])) WITH ORDINALITY
           AS w(id, o))
SELECT id, queue, headers, payload, created_at, first_attempt_at, last_attempt_at, error
FROM (
    SELECT w.o, m.id, m.queue, CAST(m.headers AS TEXT) AS headers, m.payload,
        CAST(EXTRACT(EPOCH FROM m.created_at) * 1000000 AS BIGINT) AS created_at,
        CAST(EXTRACT(EPOCH FROM m.first_attempt_at) * 1000000 AS BIGINT) AS first_attempt_at,
        CAST(EXTRACT(EPOCH FROM m.last_attempt_at) * 1000000 AS BIGINT) AS last_attempt_at,
        m.last_error AS error
    FROM w JOIN {m} AS m ON m.id = w.id
    UNION ALL
    SELECT w.o, a.id, a.queue, CAST(a.headers AS TEXT), a.payload,
        CAST(EXTRACT(EPOCH FROM a.created_at) * 1000000 AS BIGINT),
        CAST(EXTRACT(EPOCH FROM a.first_attempt_at) * 1000000 AS BIGINT),
        CAST(EXTRACT(EPOCH FROM a.last_attempt_at) * 1000000 AS BIGINT), a.error
    FROM w JOIN {a} AS a ON a.id = w.id
) AS x
ORDER BY o
"""

# ---- the sink --------------------------------------------------------------------------------

#: The server's clock as ``timestamptz``'s binary form (microseconds since 2000-01-01), the
#: ``staged_at`` of a COPY into the staging table.
SPARK_STAGE_CLOCK = ("SELECT CAST(EXTRACT(EPOCH FROM now() - TIMESTAMPTZ "
                     "'2000-01-01 00:00:00+00') * 1000000 AS BIGINT)")

#: Staged rows by binary COPY: several times faster than INSERT for the bulk of a write job.
SPARK_STAGE_COPY = ("COPY {spark_staging} (token, attempt, queue, headers, payload, delay, "
                    "staged_at, priority) FROM STDIN (FORMAT BINARY)")

#: Before :data:`SPARK_PUBLISH_STAGED`: it sorts the staged rows (payloads and all) by
#: row_id, in memory rather than in temporary files for a job of a few hundred thousand rows.
SPARK_PUBLISH_MEMORY = "SET LOCAL work_mem = '256MB'"

#: Publish the rows staged by tokens ``$1`` in attempts ``$2`` (arrays), in the order they
#: were staged, and wake the queues' subscribers as every publish does: one
#: ``pg_notify($3, queue)`` per queue (``$3`` the channel), sent when (and only if) the
#: transaction commits.
#: Returns how many messages were published.
SPARK_PUBLISH_STAGED = """
WITH moved AS (
    INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                     created_at, next_attempt_at, priority)
    SELECT queue, headers, payload, 'PENDING', 0, 0, now(),
           now() + CAST(delay AS DOUBLE PRECISION) * INTERVAL '1 second', priority
    FROM {spark_staging}
    WHERE token = ANY(CAST($1 AS TEXT[])) AND attempt = ANY(CAST($2 AS BIGINT[]))
    ORDER BY row_id
    RETURNING queue
), woken AS MATERIALIZED (
    SELECT pg_notify($3, queue) FROM (SELECT DISTINCT queue FROM moved) AS q
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM woken)
"""

# INDEX_PLANS_ON for one transaction (a pipeline step's settle, on a pooled connection).
INDEX_PLANS_LOCAL = ("SELECT set_config('enable_seqscan', 'off', true), "
                     "set_config('enable_bitmapscan', 'off', true), "
                     "set_config('plan_cache_mode', 'force_generic_plan', true)")

# ---- the archive's text search (schema version 26; see sqlmq.search) --------------------------

# What a search reads of an archived row, as a tsvector: its header values but
# {unsearched} (their JSON array as text), then its error, the runs of letters and digits
# of the first {text_limit} characters (the 'simple' configuration lowers them and keeps
# every word). A row whose headers a hand edit made no object has no header values.
# SEARCH_INDEX is a GIN index on exactly this expression and SEARCHABLE; a query names both
# word for word, so the planner matches it to the index.
SEARCH_DOCUMENT = """to_tsvector('simple'::regconfig, regexp_replace(left(
    CASE WHEN jsonb_typeof(headers) = 'object'
         THEN jsonb_path_query_array(headers - '{unsearched}', '$.*')::text ELSE '' END
    || ' ' || coalesce(error, ''), {text_limit}), '[^[:alnum:]]+', ' ', 'g'))"""

# The rows that have anything to search: an error, or a header but {unsearched}. The
# index leaves the others out, so archiving a message that completed costs it nothing.
SEARCHABLE = """(error IS NOT NULL OR CASE WHEN jsonb_typeof(headers) = 'object'
    THEN headers - '{unsearched}' <> '{{}}'::jsonb ELSE false END)"""

# Made in the migrating transaction (no CONCURRENTLY there): writes to the archive wait
# while it is built over the rows already archived.
SEARCH_INDEX = ("CREATE INDEX IF NOT EXISTS ix_{a}_search ON {a} USING gin ("
                + SEARCH_DOCUMENT + ") WHERE " + SEARCHABLE)
