"""SQLite's statements, ``:name`` parameters (aiosqlite's and SQLAlchemy's own style). Table
names are filled in once by :func:`sqlmq.engines.sql.statements.render`.

Times are ISO text with six fractional digits (naive UTC), so that values written from
Python and values computed here compare correctly as text: the clock is
``(strftime('%Y-%m-%d %H:%M:%f','now')||'000')``, and now + x seconds
``(strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',x))||'000')``. Every
transaction is BEGIN IMMEDIATE (see :mod:`.connections`): a writer holds the database's
single write lock from its first statement, so no statement here needs a row lock.
"""

from ...sqltime import sqlite_stamped
from ..sql.statements import fair_turn, let_in

# ---- publishing ------------------------------------------------------------------------------

# A publish's expiry: :expires_in seconds from now, else the moment :expires_at (NULL: never).
_EXPIRES = """CASE WHEN :expires_in IS NULL THEN :expires_at
     ELSE (strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',:expires_in))||'000') END"""

# Publish one message, due after :delay seconds, at :priority, expiring as _EXPIRES says;
# commits by itself. The commonest publish, and in one process the first half of
# publish-to-handler latency.
INSERT_ONE = """
INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, next_attempt_at, priority, expires_at)
VALUES (:queue, :headers, :payload, 'PENDING', 0, 0,
        (strftime('%Y-%m-%d %H:%M:%f','now')||'000'),
        (strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',:delay))||'000'),
        :priority, """ + _EXPIRES + """)
RETURNING id
"""

# Publish a batch on sqlmq's own connection, in one transaction: INSERT_MANY_CLOCK reads the
# clock once (created_at, the schedule: :at, or now + :delay seconds, and the expiry, as
# _EXPIRES), then INSERT_MANY
# runs once per message (the driver's executemany, in its thread, binding in C), then
# LAST_ID: under the write lock and AUTOINCREMENT the batch's ids are consecutive, ending
# there.
INSERT_MANY_CLOCK = """
SELECT (strftime('%Y-%m-%d %H:%M:%f','now')||'000'),
       COALESCE(:at, (strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',:delay))||'000')),
       """ + _EXPIRES + """
"""
INSERT_MANY = """
INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, next_attempt_at, priority, expires_at)
VALUES (:queue, :headers, :payload, 'PENDING', 0, 0, :created_at, :next_attempt_at, :priority,
        :expires_at)
"""
LAST_ID = "SELECT last_insert_rowid()"

# Publish one message already acquired, for an idle subscriber of this process: the row an
# acquire would leave, leased for :lease seconds, at :priority, expiring as _EXPIRES says;
# no row (nothing returned) if :queue is paused, as an acquire would take nothing.
# RETURNING may name only the inserted table's columns.
INSERT_LEASED = """
INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, first_attempt_at, acquired_at, next_attempt_at, lease_expires_at,
                 priority, expires_at)
SELECT :queue, :headers, :payload, 'PROCESSING', 0, 1,
       (strftime('%Y-%m-%d %H:%M:%f','now')||'000'),
       (strftime('%Y-%m-%d %H:%M:%f','now')||'000'),
       (strftime('%Y-%m-%d %H:%M:%f','now')||'000'), NULL,
       (strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',:lease))||'000'),
       :priority, """ + _EXPIRES + """
WHERE NOT EXISTS (SELECT 1 FROM {pause} WHERE queue = :queue)
RETURNING id, created_at, lease_expires_at, expires_at
"""

# ---- consuming -------------------------------------------------------------------------------

# Acquire, step 1: the ids and ready times of up to :limit ready messages of :queue,
# highest priority first, then in ready order. The ready index is in that order, but read
# from its start it would step over every entry of a higher priority not due yet (a retried
# or delayed message), and over every entry not due at all when fewer than :limit are
# ready: 30 ms behind 100,000 delayed messages. So the priorities present are found first,
# one index descent each, highest first (``levels``), and each level's ready entries read
# as one range, which ends at its first entry not due, until :limit rows are found (CROSS
# JOIN makes ``levels`` the outer loop). The levels go through a subquery with a LIMIT
# (65,536: as many as there are priorities) and the ready index is named (INDEXED BY):
# with the table's statistics (ANALYZE) and neither, the planner guessed many levels and
# built a Bloom filter over the whole table on every acquire (40 ms at 100,000 rows; a
# drain ran at 60 % of its speed). On a small table with statistics it may still build one.
# A paused queue (a row in {pause}, schema version 11) has no levels: nothing of it is read.
ACQUIRE_READY = """
WITH RECURSIVE levels(p) AS (
    SELECT (SELECT priority FROM {m} WHERE queue = :queue AND next_attempt_at IS NOT NULL
            ORDER BY priority DESC LIMIT 1)
    WHERE NOT EXISTS (SELECT 1 FROM {pause} WHERE queue = :queue)
    UNION ALL
    SELECT (SELECT priority FROM {m} WHERE queue = :queue AND next_attempt_at IS NOT NULL
              AND priority < levels.p
            ORDER BY priority DESC LIMIT 1)
    FROM levels WHERE levels.p IS NOT NULL
)
SELECT m.id, m.next_attempt_at AS scheduled_at
FROM (SELECT p FROM levels WHERE p IS NOT NULL LIMIT 65536) AS levels
CROSS JOIN {m} AS m INDEXED BY ix_{m}_ready
WHERE m.queue = :queue AND m.priority = levels.p
  AND m.next_attempt_at <= (strftime('%Y-%m-%d %H:%M:%f','now')||'000')
ORDER BY m.priority DESC, m.next_attempt_at, m.id
LIMIT :limit
"""

# The same for several queues (:queues, a JSON array): each queue's priority levels, each
# level's ready range (so entries not due are still never read), then one sort of every
# ready row of those queues, on each acquire; so one queue goes by ACQUIRE_READY. Paused
# queues are left out of the list first. INDEXED BY:
# with statistics, the planner built an automatic index of the queues' rows on every
# acquire instead (170 ms at 100,000 rows).
ACQUIRE_READY_QUEUES = """
WITH RECURSIVE levels(name, p) AS (
    SELECT q.name, (SELECT priority FROM {m} WHERE queue = q.name AND next_attempt_at IS NOT NULL
                    ORDER BY priority DESC LIMIT 1)
    FROM (SELECT DISTINCT value AS name FROM json_each(:queues)
          WHERE value NOT IN (SELECT queue FROM {pause})) AS q
    UNION ALL
    SELECT levels.name, (SELECT priority FROM {m} WHERE queue = levels.name
                           AND next_attempt_at IS NOT NULL AND priority < levels.p
                         ORDER BY priority DESC LIMIT 1)
    FROM levels WHERE levels.p IS NOT NULL
)
SELECT m.id, m.next_attempt_at AS scheduled_at
FROM (SELECT name, p FROM levels WHERE p IS NOT NULL LIMIT 65536) AS levels
CROSS JOIN {m} AS m INDEXED BY ix_{m}_ready
WHERE m.queue = levels.name AND m.priority = levels.p
  AND m.next_attempt_at <= (strftime('%Y-%m-%d %H:%M:%f','now')||'000')
ORDER BY m.priority DESC, m.next_attempt_at, m.id
LIMIT :limit
"""

# Acquire, step 2, in the same transaction: mark :ids (a JSON array) PROCESSING, leased for
# :lease seconds, and return them. Each row is checked to wait still, as the other engines'
# takes check it, though BEGIN IMMEDIATE already keeps other writers out since the read.
def _take(cleared: str) -> str:
    """The take of :ids, clearing their due column ``cleared``."""
    return f"""
UPDATE {{m}} SET
    state = 'PROCESSING',
    deliveries_count = deliveries_count + 1,
    acquired_at = (strftime('%Y-%m-%d %H:%M:%f','now')||'000'),
    first_attempt_at = COALESCE(first_attempt_at, (strftime('%Y-%m-%d %H:%M:%f','now')||'000')),
    {cleared} = NULL,
    lease_expires_at = (strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',:lease))||'000')
WHERE id IN (SELECT value FROM json_each(:ids)) AND state IN ('PENDING', 'RETRYABLE')
  AND {cleared} IS NOT NULL
RETURNING id, queue, headers, payload, attempts_count, deliveries_count, created_at,
    first_attempt_at, acquired_at, lease_expires_at, NULL AS scheduled_at, history, priority,
    expires_at, saved_state, defers_count, cancel_requested
"""


ACQUIRE_TAKE = _take("next_attempt_at")

# The same for a channel's messages (the fair pick's, the limited pick's, those a settle
# passes a slot or a turn on to): their due time is channel_due_at, which is cleared instead.
ACQUIRE_TAKE_CHANNEL = _take("channel_due_at")

# ---- channels: the limited pick and the slots a settle passes on ----------------------------
#
# Raw, one trip to the driver's thread each, as the acquire's and the settle's statements:
# through SQLAlchemy's cursor each was three trips on an event loop busy with handlers, and a
# slot passed on by a settle spent half its time between two handlers in them
# (``bench.slot_cycle``). The same reads as core_channels' ``_slot_limits`` and
# ``_due_per_channel_in_order`` build for the other databases.

# How many messages of a limited channel run: from the index (channel, state,
# channel_due_at), partial on fair_key IS NULL since schema version 20 (the messages of
# limited channels: no other channel's running deliveries are counted), named: told the
# condition, SQLite's planner read the index (channel, fair_key, id) by both its columns
# instead, every message of the channel. running_of counts channel row ``row``'s (a
# correlated subquery of core_channels' candidates and of SLOT_LIMITS); RUNNING the channels
# of :names (a JSON array), one row each that has any.
def running_of(row: str) -> str:
    """The count of channel row ``row``'s running messages."""
    return f"""(SELECT count(*) FROM {{m}} AS r INDEXED BY ix_{{m}}_channel
 WHERE r.channel = {row}.name AND r.fair_key IS NULL AND r.state = 'PROCESSING')"""


RUNNING = """
SELECT r.channel, count(*) AS n FROM {m} AS r INDEXED BY ix_{m}_channel
WHERE r.channel IN (SELECT value FROM json_each(:names)) AND r.fair_key IS NULL
  AND r.state = 'PROCESSING'
GROUP BY r.channel
"""

# The channels of :names (a JSON array): their own settings, their queue's default's (as
# core_room.effective reads them) and how many of their messages run (running_of: an
# ordered channel without other limits counts none, its messages having fair keys; what
# runs of it is seen by the pass of its next head, which starts one only if it comes first).
SLOT_LIMITS = """
SELECT c.name, c.configured, c.max_concurrency, c.rate, c.ordered, c.max_size,
       d.max_concurrency, d.rate, d.ordered, d.max_size,
       """ + running_of("c") + """
FROM {channel} AS c LEFT JOIN {channel_default} AS d ON d.queue = c.queue
WHERE c.name IN (SELECT value FROM json_each(:names))
"""

# Each channel of :names: its first :most due messages in the queues :queues (JSON arrays),
# in acquire order (priority, due time, id), numbered from 1 per channel. Read from the index
# (channel, priority DESC, channel_due_at, id), partial on fair_key IS NULL (true of every
# limited channel's message) since schema version 17, in order and cut at :most: told the
# condition plainly, SQLite read the index (channel, fair_key, id) by both columns instead
# and sorted the channel's whole backlog; told it is likely() (it is), it reads this one.
DUE_PER_CHANNEL = """
SELECT m.id, m.channel, m.channel_due_at, row_number() OVER (
    PARTITION BY m.channel ORDER BY m.priority DESC, m.channel_due_at, m.id) AS rn
FROM json_each(:names) AS j JOIN {m} AS m ON m.id IN (
    SELECT f.id FROM {m} AS f
    WHERE f.channel = j.value AND f.state IN ('PENDING', 'RETRYABLE')
      AND f.queue IN (SELECT value FROM json_each(:queues))
      AND f.queue NOT IN (SELECT queue FROM {pause})
      AND f.channel_due_at <= (strftime('%Y-%m-%d %H:%M:%f','now')||'000')
      AND likely(f.fair_key IS NULL)
    ORDER BY f.priority DESC, f.channel_due_at, f.id
    LIMIT :most)
"""

# ---- channels without limits: the fair acquire ----------------------------------------------
#
# The fair acquire (core_fair's FairAcquire, whose transaction runs these), straight on the
# driver as the take is: through SQLAlchemy's cursor the pick, the letting in and the clock
# were three trips to the driver's thread each, with the write lock held, on an event loop
# that runs the handlers meanwhile.

# Up to :most due messages of channels without limits, in fair_key order below {blocked}, an
# ordered channel's only while nothing of its channel comes before it (fair_turn); with whether
# the channel is ordered. FAIR_PICK reads one queue (:queue) as one range of the index
# (queue, fair_key, id), in order, until :most are found; FAIR_PICK_QUEUES the queues :queues
# (a JSON array), whose rows it sorts, as SQLAlchemy's list of queues did. A paused queue
# gives nothing.
def _fair_pick(queues: str) -> str:
    return """
SELECT f.id, f.channel, f.channel_due_at, f.queue, f.fair_key, f.ordered = 1
FROM {m} AS f INDEXED BY ix_{m}_fair
WHERE """ + queues + """ AND f.fair_key IS NOT NULL AND f.fair_key < {blocked}
  AND f.channel_due_at <= (strftime('%Y-%m-%d %H:%M:%f','now')||'000')
  AND f.state IN ('PENDING', 'RETRYABLE') AND f.queue NOT IN (SELECT queue FROM {pause})
  AND """ + fair_turn("INDEXED BY ix_{m}_channel_key") + """
ORDER BY f.fair_key, f.id
LIMIT :most
"""


FAIR_PICK = _fair_pick("f.queue = :queue")
FAIR_PICK_QUEUES = _fair_pick("f.queue IN (SELECT value FROM json_each(:queues))")

# Let in the next message of each ordered channel of :names (a JSON array) whose head was
# just taken (core_fair's promotion).
FAIR_LET_IN = let_in("t", "TRUE", hint="INDEXED BY ix_{m}_channel_key",
                     source="(SELECT value AS channel FROM json_each(:names)) AS t")

# The first message in key order of each ordered channel of :names (a JSON array) whose head
# a settle archived or put back (core_fair's _next_in_order), where it waits in the queues
# :queues (not paused), is due and is below {blocked}: one probe of the index (channel,
# fair_key, id) per channel, whatever its backlog.
NEXT_IN_ORDER = """
SELECT m.id, m.channel, m.channel_due_at
FROM json_each(:names) AS j JOIN {m} AS m ON m.id = (
    SELECT u.id FROM {m} AS u INDEXED BY ix_{m}_channel_key
    WHERE u.channel = j.value AND u.fair_key IS NOT NULL
    ORDER BY u.fair_key, u.id LIMIT 1)
WHERE m.queue IN (SELECT value FROM json_each(:queues))
  AND m.state IN ('PENDING', 'RETRYABLE') AND m.fair_key < {blocked}
  AND m.channel_due_at <= (strftime('%Y-%m-%d %H:%M:%f','now')||'000')
  AND m.queue NOT IN (SELECT queue FROM {pause})
ORDER BY m.fair_key, m.id
"""

# The queue :queue's clock moved on to :turn (made if need be; never back).
FAIR_CLOCK = """
INSERT INTO {channel_clock} (queue, turn) VALUES (:queue, :turn)
ON CONFLICT (queue) DO UPDATE SET turn = max(turn, excluded.turn)
"""

# Settle, in one transaction. The batch :input is one JSON array of [id, deliveries,
# outcome, error, delay, refund, attempted, history, keep] per settlement (see
# SqlEngine.settlement_json). Every statement is fenced on (id, deliveries, PROCESSING).
# A new history's newest entry gets the statement's time (sqlmq.sqltime.sqlite_stamped).

# Copy the batch's COMPLETED, FAILED and EXPIRED rows to the archive (those kept: the
# subscriber's archive= setting; SETTLE_DELETE deletes them all).
SETTLE_ARCHIVE = """
WITH i AS (
    SELECT value->>0 AS id, value->>1 AS deliveries, value->>2 AS outcome, value->>3 AS error,
           value->>4 AS delay, value->>5 AS refund, value->>6 AS attempt, value->>7 AS history,
           value->>8 AS keep
    FROM json_each(:input)
)
INSERT INTO {a} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, first_attempt_at, last_attempt_at, archived_at, error, history,
                 priority, channel)
SELECT m.id, m.queue, m.headers, m.payload, i.outcome, m.attempts_count + i.attempt,
       m.deliveries_count, m.created_at, m.first_attempt_at,
       CASE WHEN i.attempt = 1 THEN (strftime('%Y-%m-%d %H:%M:%f','now')||'000')
            ELSE m.last_attempt_at END,
       (strftime('%Y-%m-%d %H:%M:%f','now')||'000'), i.error,
       COALESCE(""" + sqlite_stamped("i.history") + """, m.history), m.priority, m.channel
FROM i JOIN {m} AS m ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED', 'EXPIRED')
  AND i.keep = 1
"""

# Delete the rows just archived (BEGIN IMMEDIATE holds every other writer off, so these are
# exactly those rows); returns the ids that landed.
SETTLE_DELETE = """
WITH i AS (
    SELECT value->>0 AS id, value->>1 AS deliveries, value->>2 AS outcome, value->>3 AS error,
           value->>4 AS delay, value->>5 AS refund, value->>6 AS attempt, value->>7 AS history
    FROM json_each(:input)
)
DELETE FROM {m} WHERE id IN (
    SELECT m.id FROM i JOIN {m} AS m ON m.id = i.id AND m.deliveries_count = i.deliveries
    WHERE m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED', 'EXPIRED')
)
RETURNING id
"""

# Put the batch's RETRY rows back as RETRYABLE after their delay, its RELEASE rows as
# PENDING (a refunded first delivery leaves no times behind); returns the ids that landed.
SETTLE_UPDATE = """
WITH i AS (
    SELECT value->>0 AS id, value->>1 AS deliveries, value->>2 AS outcome, value->>3 AS error,
           value->>4 AS delay, value->>5 AS refund, value->>6 AS attempt, value->>7 AS history
    FROM json_each(:input)
)
UPDATE {m} AS m SET
    state = CASE WHEN i.outcome = 'RETRY' THEN 'RETRYABLE' ELSE 'PENDING' END,
    attempts_count = m.attempts_count + i.attempt,
    first_attempt_at = CASE WHEN m.deliveries_count = i.refund THEN NULL
                            ELSE m.first_attempt_at END,
    acquired_at = CASE WHEN m.deliveries_count = i.refund THEN NULL ELSE m.acquired_at END,
    deliveries_count = m.deliveries_count - i.refund,
    last_attempt_at = CASE WHEN i.attempt = 1 THEN (strftime('%Y-%m-%d %H:%M:%f','now')||'000')
                           ELSE m.last_attempt_at END,
    next_attempt_at = CASE WHEN m.channel IS NULL THEN
        (strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',i.delay))||'000') END,
    channel_due_at = CASE WHEN m.channel IS NOT NULL THEN
        (strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',i.delay))||'000') END,
    lease_expires_at = NULL,
    last_error = COALESCE(i.error, m.last_error),
    history = COALESCE(""" + sqlite_stamped("i.history") + """, m.history)
FROM i
WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
  AND i.outcome IN ('RETRY', 'RELEASE')
RETURNING id
"""

# Push the leases of held deliveries (:leases, a JSON array of [id, deliveries]) to now +
# :seconds; returns the ids still held.
EXTEND = """
UPDATE {m} AS m
SET lease_expires_at = (strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',:seconds))||'000')
FROM (SELECT value->>0 AS id, value->>1 AS deliveries FROM json_each(:leases)) AS i
WHERE m.id = i.id AND m.deliveries_count = i.deliveries AND m.state = 'PROCESSING'
RETURNING id
"""

# ---- maintenance -----------------------------------------------------------------------------

# Return up to :limit messages whose lease expired to PENDING, each ready within :spread
# seconds at random, recording the expiry in their history (which keeps its newest
# entries). BEGIN IMMEDIATE already makes recoverers take turns.
RECOVER_EXPIRED = """
UPDATE {m} SET
    state = 'PENDING',
    next_attempt_at = CASE WHEN channel IS NULL THEN
        (strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',
        (abs(random()) % 1000000) / 1000000.0 * :spread))||'000') END,
    channel_due_at = CASE WHEN channel IS NOT NULL THEN
        (strftime('%Y-%m-%d %H:%M:%f','now',printf('%+.6f seconds',
        (abs(random()) % 1000000) / 1000000.0 * :spread))||'000') END,
    lease_expires_at = NULL,
    last_error = 'lease expired',
    history = CASE
        WHEN json_array_length(json_insert(COALESCE(history, '[]'), '$[#]', json_object(
            'delivery', deliveries_count, 'ended', 'lease_expired',
            'at', strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')))) > {history_limit}
        THEN json_remove(json_insert(COALESCE(history, '[]'), '$[#]', json_object(
            'delivery', deliveries_count, 'ended', 'lease_expired',
            'at', strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'))), '$[0]')
        ELSE json_insert(COALESCE(history, '[]'), '$[#]', json_object(
            'delivery', deliveries_count, 'ended', 'lease_expired',
            'at', strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')))
    END
WHERE id IN (
    SELECT id FROM {m}
    WHERE lease_expires_at < (strftime('%Y-%m-%d %H:%M:%f','now')||'000')
      AND state = 'PROCESSING'
    ORDER BY lease_expires_at
    LIMIT :limit
)
RETURNING id
"""

# Checkpoint the whole log and truncate its file (sqlmq.engines.sqlite.log), waiting 50 ms at
# most (LOG_TRUNCATE_WAIT, the busy timeout while it runs) for the commit before it (whose
# own checkpoint may still run) and for readers of older snapshots; one row: busy (1: given
# up), the log's pages, those copied.
LOG_TRUNCATE_WAIT = "PRAGMA busy_timeout=50"
LOG_TRUNCATE = "PRAGMA wal_checkpoint(TRUNCATE)"

# The database file's commit counter: changes whenever any connection commits a write.
DATA_VERSION = "PRAGMA data_version"


# ---- the Spark source and sink (run by sqlmq/engines/spark/) -------------------------------
# Table names are filled by ``render(text, names)`` (``str.format``): ``{spark_lease}``.
# Parameters are the driver's ``:name``. The stream acquires with the engine's own ready and
# take statements inside its write transaction (BEGIN IMMEDIATE), which return the taken rows;
# the sink needs nothing of its own here: it publishes with SQLAlchemy Core, the same on
# every database but PostgreSQL.

#: Record one message just taken as part of lease sequence ``:seq`` of ``:consumer`` (sent
#: once for all of them, as an executemany).
SPARK_RECORD_LEASE = """
INSERT INTO {spark_lease} (consumer, seq, id, deliveries, attempts)
VALUES (:consumer, :seq, :id, :deliveries, :attempts)
"""

# ---- lists -----------------------------------------------------------------------------------

# A JSON array bound as :{key}, as rows: each item (v) and its place from 1 (i). The channel
# acquire's lists of ids and names, one parameter whatever their length (sql_lists.py).
LIST_ITEMS = "SELECT key + 1 AS i, value AS v FROM json_each(:{key})"

# ---- the archive's text search (schema version 26; see sqlmq.search) --------------------------


def _search_words(row: str) -> str:
    """What a search reads of archive row ``row``: its header values but {unsearched}, then
    its error, the first {text_limit} characters (the tokenizer finds the words and lowers
    them). Headers a hand edit left no JSON object have no values: a trigger that failed on
    them would fail the settle that archives the row."""
    headers = (f"CASE WHEN NOT json_valid({row}.headers) THEN '{{{{}}}}' "
               f"WHEN json_type({row}.headers) = 'object' THEN {row}.headers ELSE '{{{{}}}}' END")
    return (f"substr(trim(coalesce((SELECT group_concat(value, ' ') FROM json_each({headers}) "
            f"WHERE key <> '{{unsearched}}'), '') || ' ' || coalesce({row}.error, '')), "
            "1, {text_limit})")


# An FTS5 index without content of its own (content=''): the words of each archived row
# that has any, under the row's id. Kept by the triggers below, in the transaction that
# archives, requeues or purges the row; a row with nothing to search is never in it.
# remove_diacritics 0: 'é' stays 'é', as PostgreSQL's and MariaDB's indexes keep it.
SEARCH_TABLE = ("CREATE VIRTUAL TABLE {search} USING fts5(words, content='', "
                "tokenize='unicode61 remove_diacritics 0')")
SEARCH_TABLE_DROP = "DROP TABLE IF EXISTS {search}"
SEARCH_ON_INSERT = f"""
CREATE TRIGGER IF NOT EXISTS {{search}}_insert AFTER INSERT ON {{a}}
WHEN {_search_words("NEW")} <> ''
BEGIN
    INSERT INTO {{search}} (rowid, words) VALUES (NEW.id, {_search_words("NEW")});
END"""
# An index without content forgets a row only when told its words, exactly as indexed.
SEARCH_ON_DELETE = f"""
CREATE TRIGGER IF NOT EXISTS {{search}}_delete AFTER DELETE ON {{a}}
WHEN {_search_words("OLD")} <> ''
BEGIN
    INSERT INTO {{search}} ({{search}}, rowid, words)
    VALUES ('delete', OLD.id, {_search_words("OLD")});
END"""
SEARCH_ON_UPDATE = f"""
CREATE TRIGGER IF NOT EXISTS {{search}}_update AFTER UPDATE OF headers, error ON {{a}}
BEGIN
    INSERT INTO {{search}} ({{search}}, rowid, words)
    SELECT 'delete', OLD.id, {_search_words("OLD")} WHERE {_search_words("OLD")} <> '';
    INSERT INTO {{search}} (rowid, words)
    SELECT NEW.id, {_search_words("NEW")} WHERE {_search_words("NEW")} <> '';
END"""
# The rows archived before the index was made.
SEARCH_FILL = f"""
INSERT INTO {{search}} (rowid, words)
SELECT r.id, {_search_words("r")} FROM {{a}} AS r WHERE {_search_words("r")} <> ''
"""

# The ids of the rows with every word of :search (an FTS5 query), newest first: read from
# the index in descending id order, so a page costs the same whatever the number found.
SEARCH_HITS = """SELECT rowid AS id FROM {search} WHERE {search} MATCH :search
ORDER BY rowid DESC LIMIT :limit"""
SEARCH_HITS_BELOW = """SELECT rowid AS id FROM {search} WHERE {search} MATCH :search
AND rowid < :before ORDER BY rowid DESC LIMIT :limit"""
