"""MySQL 8 and MariaDB 10.6+ statements. ``%s`` parameters: sent straight to the driver
(the hot path's packets, see :mod:`sqlmq.engines.mysql.engine`); ``:name`` parameters: run through
SQLAlchemy's ``text()`` (off the hot path). Table names are filled in once by
:func:`sqlmq.engines.sql.statements.render`.

The database clock is ``UTC_TIMESTAMP(6)``. A packet that needs a transaction opens and
commits it itself (``BEGIN`` … ``COMMIT``), so that the COMMIT travels with its statements;
state shared between the statements of one packet stays on the server in session variables
(``@sqlmq_level``, ``@sqlmq_now``, ``@sqlmq_take``, ``@sqlmq_settle`` …).
"""

from ...sqltime import mysql_stamped
from ..sql.statements import fair_kind, fair_turn, let_in, passing_limit

# ---- transactions of one packet --------------------------------------------------------------

BEGIN = "START TRANSACTION"
COMMIT = "COMMIT"

# ---- publishing ------------------------------------------------------------------------------

# Publish one message (%s queue, headers, payload, delay in microseconds, priority, then
# the expiry: a moment, else microseconds from now; both NULL: never): the INSERT commits by
# itself; LAST_ID, in the same packet, reads its id.
INSERT_ONE = """
INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, next_attempt_at, priority, expires_at)
VALUES (%s, %s, %s, 'PENDING', 0, 0, UTC_TIMESTAMP(6),
        UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, %s,
        COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND))
"""
LAST_ID = "SELECT LAST_INSERT_ID()"

# Publish one message already acquired, for an idle subscriber of this process: the row an
# acquire would leave, at one clock reading (INSERT_LEASED_CLOCK, then INSERT_LEASED with
# %s queue, headers, payload, lease in microseconds, priority and the expiry as in
# INSERT_ONE, and the queue again, then INSERT_LEASED_READ: id and clock). Nothing is
# inserted if the queue is paused (schema version 11): the id read is then NULL.
INSERT_LEASED_CLOCK = "SET @sqlmq_now = UTC_TIMESTAMP(6)"
INSERT_LEASED = """
INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, first_attempt_at, acquired_at, next_attempt_at, lease_expires_at,
                 priority, expires_at)
SELECT %s, %s, %s, 'PROCESSING', 0, 1, @sqlmq_now, @sqlmq_now, @sqlmq_now, NULL,
       @sqlmq_now + INTERVAL %s MICROSECOND, %s,
       COALESCE(%s, @sqlmq_now + INTERVAL %s MICROSECOND)
FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {pause} WHERE queue = %s)
"""
INSERT_LEASED_READ = ("SELECT IF(ROW_COUNT() > 0, LAST_INSERT_ID(), NULL), "
                      "CAST(@sqlmq_now AS DATETIME(6))")

# Publish a batch on sqlmq's own connection, MariaDB (RETURNING): the values the rows share
# once, in session variables (INSERT_MANY_SHARED: %s queue, priority, the expiry as in
# INSERT_ONE; then the schedule as
# INSERT_MANY_DELAY's microseconds or INSERT_MANY_AT's moment), then multi-row INSERTs whose
# rows carry only their headers and payload (INSERT_MANY_ROW, joined by ROWS_SEPARATOR into
# {rows}), each returning its ids. Straight to the driver: SQLAlchemy's per-row parameter
# processing was two fifths of a batch's time.
INSERT_MANY_SHARED = """
SET @sqlmq_queue = %s, @sqlmq_priority = %s, @sqlmq_now = UTC_TIMESTAMP(6),
    @sqlmq_expires = COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)"""
INSERT_MANY_DELAY = "SET @sqlmq_when = @sqlmq_now + INTERVAL %s MICROSECOND"
INSERT_MANY_AT = "SET @sqlmq_when = CAST(%s AS DATETIME(6))"
INSERT_MANY = """
INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, next_attempt_at, priority, expires_at)
VALUES {rows}
RETURNING id
"""
INSERT_MANY_ROW = ("(@sqlmq_queue, %s, %s, 'PENDING', 0, 0, @sqlmq_now, @sqlmq_when, "
                   "@sqlmq_priority, @sqlmq_expires)")
ROWS_SEPARATOR = ",\n"

# ---- consuming: acquire, one packet, one transaction ----------------------------------------

# Acquire reads one priority level per packet, from the ready index of these databases,
# ix_{m}_ready_asc (queue, priority, next_attempt_at, id): priority ascending, unlike the
# other databases' (they have partial indexes and skip scans; these have neither). Within a
# level, in-flight entries (no ready time) come first, then ready ones, then delayed ones.
#
# 1. The level: ACQUIRE_LEVEL sets a session variable to the highest priority below a bound
#    among the queues' messages (NULL: none), one descent per queue: ACQUIRE_LEVEL_OF_QUEUE
#    (the index read backwards from the bound, so it lands on the level's last entry, a
#    delayed or recent one, not on the in-flight ones and the settled ones not yet purged
#    that lead it: 3-4 ms per acquire when read forwards), joined by UNION_ALL. Parameters:
#    each queue and, in the first, its bound. A paused queue (a row in {pause}, schema
#    version 11) gives no row: the pause is read once per queue, by primary key, and the
#    queue's index is not read (the one-row table ``g`` is a constant to the optimizer, so
#    the probe stays a range read, as with the queue written in).
ACQUIRE_LEVEL = "SET {level} = (SELECT MAX(p) FROM ({of_queues}) AS l)"
ACQUIRE_LEVEL_OF_QUEUE = """
SELECT (SELECT priority FROM {m} FORCE INDEX (ix_{m}_ready_asc)
        WHERE queue = g.name AND priority < g.below
        ORDER BY priority DESC LIMIT 1) AS p
FROM (SELECT %s AS name, {below} AS below) AS g
WHERE g.name NOT IN (SELECT queue FROM {pause})"""
UNION_ALL = "\nUNION ALL"

# 2. Lock up to %s ready rows of the queues at that level (@sqlmq_level, a constant to the
#    optimizer: one range per queue that starts after the in-flight entries and stops at
#    the first delayed one) in ready order, and keep their ids and the clock in session
#    variables. Parameters: the queues, then the limit. An empty poll of 100,000 delayed
#    messages, or ready messages behind 100,000 delayed ones of a higher priority, read a
#    few entries. (Several queues: their ready rows at the level are sorted into one order.)
#    Paused queues: their rows are left out (the pause table is read once, materialised);
#    a paused queue has no level of its own, so it is read only when it shares the level of
#    a queue that is not paused, whose rows this statement reads and sorts anyway.
ACQUIRE_LOCK = """
SELECT JSON_ARRAYAGG(id), UTC_TIMESTAMP(6) INTO @sqlmq_take, @sqlmq_now FROM (
    SELECT id FROM {m} FORCE INDEX (ix_{m}_ready_asc)
    WHERE queue IN ({queues}) AND priority = @sqlmq_level
      AND next_attempt_at <= UTC_TIMESTAMP(6) AND queue NOT IN (SELECT queue FROM {pause})
    ORDER BY next_attempt_at, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
) AS r
"""

# 3. Return the locked rows as they are now, the clock, their priority and expiry, and what
#    defer and cancellation left on them.
def _read(due: str, more: str = "") -> str:
    """ACQUIRE_READ with the rows' due column ``due``; ``more``: columns after the usual."""
    return f"""
SELECT m.id, m.queue, m.headers, m.payload, m.attempts_count, m.deliveries_count,
       m.created_at, m.first_attempt_at, m.{due}, m.history,
       CAST(@sqlmq_now AS DATETIME(6)), m.priority, m.expires_at, m.saved_state,
       m.defers_count, m.cancel_requested{more}
FROM JSON_TABLE(@sqlmq_take, '$[*]' COLUMNS (id BIGINT PATH '$')) AS t
STRAIGHT_JOIN {{m}} AS m FORCE INDEX (PRIMARY) ON m.id = t.id
"""


ACQUIRE_READ = _read("next_attempt_at")

# 4. Mark them PROCESSING, leased for %s microseconds.
def _take(cleared: str) -> str:
    """ACQUIRE_TAKE clearing the rows' due column ``cleared``."""
    return f"""
UPDATE JSON_TABLE(@sqlmq_take, '$[*]' COLUMNS (id BIGINT PATH '$')) AS t
STRAIGHT_JOIN {{m}} AS m FORCE INDEX (PRIMARY) ON m.id = t.id SET
    m.state = 'PROCESSING',
    m.deliveries_count = m.deliveries_count + 1,
    m.acquired_at = CAST(@sqlmq_now AS DATETIME(6)),
    m.first_attempt_at = COALESCE(m.first_attempt_at, CAST(@sqlmq_now AS DATETIME(6))),
    m.{cleared} = NULL,
    m.lease_expires_at = CAST(@sqlmq_now AS DATETIME(6)) + INTERVAL %s MICROSECOND
"""


ACQUIRE_TAKE = _take("next_attempt_at")

# 5. The level read and the next one below it (ACQUIRE_LEVEL again, into @sqlmq_next): when
#    that is not NULL and the packet took fewer rows than asked, acquire sends another
#    packet, for the levels below this one.
ACQUIRE_LEVELS_READ = "SELECT @sqlmq_level, @sqlmq_next"

# ---- consuming: the fair acquire of channels without limits (schema version 13) -----------
#
# One packet, one transaction, as the plain acquire (see sqlmq.engines.sql.fair for what it
# does). 1. FAIR_PICK: up to %s due messages of the channels without limits in the queues,
# in fair order (an ordered channel's only while nothing of its comes before them), read
# without locks (a locking read might lock the channel rows its subqueries read), their ids
# into @sqlmq_pick. Parameters: the queues, then the limit.
FAIR_PICK = """
SELECT JSON_ARRAYAGG(id) INTO @sqlmq_pick FROM (
    SELECT f.id FROM {m} AS f FORCE INDEX (ix_{m}_fair)
    WHERE f.queue IN ({queues}) AND f.fair_key IS NOT NULL AND f.fair_key < {blocked}
      AND f.channel_due_at <= UTC_TIMESTAMP(6) AND f.state IN ('PENDING', 'RETRYABLE')
      AND f.queue NOT IN (SELECT queue FROM {pause})
      AND """ + fair_turn("FORCE INDEX (ix_{m}_channel_key)") + """
    ORDER BY f.fair_key, f.id
    LIMIT %s
) AS r
"""

# 2. Lock those still waiting (SKIP LOCKED), their ids and the clock into @sqlmq_take and
#    @sqlmq_now; 3. FAIR_READ them (with their channel, key, and whether it is ordered);
#    4. FAIR_TAKE them, leased for %s microseconds; 5. move each queue's clock on to the
#    lowest turn taken (FAIR_CLOCK).
def _lock_waiting(picked: str, into: str) -> str:
    """Lock the channel messages listed in session variable ``picked`` that still wait
    (SKIP LOCKED), ``into`` taking the JSON array of their ids (``r.id``) as the first
    of its SELECT's columns."""
    return f"""
SELECT {into} FROM (
    SELECT m.id
    FROM JSON_TABLE(COALESCE({picked}, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$')) AS t
    STRAIGHT_JOIN {{m}} AS m FORCE INDEX (PRIMARY) ON m.id = t.id
    WHERE m.state IN ('PENDING', 'RETRYABLE') AND m.channel_due_at IS NOT NULL
    FOR UPDATE SKIP LOCKED
) AS r
"""


FAIR_LOCK = _lock_waiting(
    "@sqlmq_pick", "JSON_ARRAYAGG(r.id), UTC_TIMESTAMP(6) INTO @sqlmq_take, @sqlmq_now")

FAIR_READ = _read("channel_due_at", ", m.channel, m.fair_key, m.ordered = 1")

FAIR_TAKE = _take("channel_due_at")

# 6. Let in the next message of each ordered channel whose head was taken (FAIR_LET_IN).
FAIR_LET_IN = let_in("t", "TRUE", hint="FORCE INDEX (ix_{m}_channel_key)", source="""(
        SELECT DISTINCT m.channel
        FROM JSON_TABLE(COALESCE(@sqlmq_take, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$')) AS j
        STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY) ON m.id = j.id
        WHERE m.ordered = 1) AS t""")

FAIR_CLOCK = """
INSERT INTO {channel_clock} (queue, turn)
SELECT m.queue, MIN(m.fair_key & {turn_mask})
FROM JSON_TABLE(COALESCE(@sqlmq_take, '[]'), '$[*]' COLUMNS (id BIGINT PATH '$')) AS t
STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY) ON m.id = t.id
GROUP BY m.queue
ON DUPLICATE KEY UPDATE turn = GREATEST(turn, VALUES(turn))
"""

# JSON_ARRAYAGG is cut at group_concat_max_len bytes on MariaDB: an acquire takes at most as
# many ids as fit (see MysqlEngine._id_list_limit).
GROUP_CONCAT_MAX_LEN = "SELECT @@group_concat_max_len"

# ---- consuming: settle, one packet, one transaction -----------------------------------------
#
# The batch is one JSON value (see SqlEngine.settlement_json: id, deliveries, outcome, error,
# delay, refund, attempted, history, keep), put in a session variable once and opened by each
# statement. The batch drives every join, by primary key (STRAIGHT_JOIN, FORCE INDEX): on a
# small table the optimizer would rather scan it, locking rows that are not in the batch and
# deadlocking with acquire. A new history's newest entry gets the statement's time
# (sqlmq.sqltime.mysql_stamped).

SETTLE_INPUT = "SET @sqlmq_settle = %s"

# Lock the batch's rows still held by their delivery; the ids locked are what lands.
SETTLE_LOCK = """
SELECT m.id FROM JSON_TABLE(@sqlmq_settle, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]', outcome VARCHAR(10) PATH '$[2]',
    error LONGTEXT PATH '$[3]', delay DOUBLE PATH '$[4]', refund INT PATH '$[5]',
    attempt INT PATH '$[6]', history LONGTEXT PATH '$[7]'
)) AS i STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY)
    ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING'
FOR UPDATE
"""

# Copy the batch's COMPLETED, FAILED and EXPIRED rows to the archive (those kept: the
# subscriber's archive= setting; SETTLE_DELETE deletes them all).
SETTLE_ARCHIVE = """
INSERT INTO {a} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, first_attempt_at, last_attempt_at, archived_at, error, history,
                 priority, channel)
SELECT m.id, m.queue, m.headers, m.payload, i.outcome, m.attempts_count + i.attempt,
       m.deliveries_count, m.created_at, m.first_attempt_at,
       CASE WHEN i.attempt = 1 THEN UTC_TIMESTAMP(6) ELSE m.last_attempt_at END,
       UTC_TIMESTAMP(6), i.error, COALESCE(""" + mysql_stamped("i.history") + """, m.history),
       m.priority, m.channel
FROM JSON_TABLE(@sqlmq_settle, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]', outcome VARCHAR(10) PATH '$[2]',
    error LONGTEXT PATH '$[3]', delay DOUBLE PATH '$[4]', refund INT PATH '$[5]',
    attempt INT PATH '$[6]', history LONGTEXT PATH '$[7]', keep INT PATH '$[8]'
)) AS i STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY)
    ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED', 'EXPIRED')
  AND i.keep = 1
"""

# Delete the rows just archived.
SETTLE_DELETE = """
DELETE m FROM JSON_TABLE(@sqlmq_settle, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]', outcome VARCHAR(10) PATH '$[2]',
    error LONGTEXT PATH '$[3]', delay DOUBLE PATH '$[4]', refund INT PATH '$[5]',
    attempt INT PATH '$[6]', history LONGTEXT PATH '$[7]'
)) AS i STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY)
    ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED', 'EXPIRED')
"""

# Put the batch's RETRY rows back as RETRYABLE after their delay, its RELEASE rows as
# PENDING (a refunded first delivery leaves no times behind).
SETTLE_UPDATE = """
UPDATE JSON_TABLE(@sqlmq_settle, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]', outcome VARCHAR(10) PATH '$[2]',
    error LONGTEXT PATH '$[3]', delay DOUBLE PATH '$[4]', refund INT PATH '$[5]',
    attempt INT PATH '$[6]', history LONGTEXT PATH '$[7]'
)) AS i STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY)
    ON m.id = i.id AND m.deliveries_count = i.deliveries
SET
    m.state = CASE WHEN i.outcome = 'RETRY' THEN 'RETRYABLE' ELSE 'PENDING' END,
    m.attempts_count = m.attempts_count + i.attempt,
    m.first_attempt_at = CASE WHEN m.deliveries_count = i.refund THEN NULL
                              ELSE m.first_attempt_at END,
    m.acquired_at = CASE WHEN m.deliveries_count = i.refund THEN NULL ELSE m.acquired_at END,
    m.deliveries_count = m.deliveries_count - i.refund,
    m.last_attempt_at = CASE WHEN i.attempt = 1 THEN UTC_TIMESTAMP(6)
                             ELSE m.last_attempt_at END,
    m.next_attempt_at = CASE WHEN m.channel IS NULL THEN UTC_TIMESTAMP(6)
                        + INTERVAL CAST(i.delay * 1000000 AS SIGNED) MICROSECOND END,
    m.channel_due_at = CASE WHEN m.channel IS NOT NULL THEN UTC_TIMESTAMP(6)
                       + INTERVAL CAST(i.delay * 1000000 AS SIGNED) MICROSECOND END,
    m.lease_expires_at = NULL,
    m.last_error = COALESCE(i.error, m.last_error),
    m.history = COALESCE(""" + mysql_stamped("i.history") + """, m.history)
WHERE m.state = 'PROCESSING' AND i.outcome IN ('RETRY', 'RELEASE')
"""

SETTLE_CLEAR = "SET @sqlmq_settle = NULL"

# ---- settle passing freed channel slots on, one packet, one transaction ---------------------
#
# (see sqlmq.engines.sql.slots) The settle above, with, after SETTLE_LOCK and before the
# settle's writes:
# PASS_ROOM: per channel among the results that held a slot (%s: a JSON array of [id,
# deliveries, channel]) and land (their row still held, as SETTLE_LOCK's), how many of its
# slots may be passed on, into @sqlmq_room as [channel, room]: as many as land, within its
# max_concurrency less what runs once they end, for a channel whose one limit that is.
# The channels first, then their rows by key (STRAIGHT_JOIN, FORCE INDEX), as the settle's.
PASS_ROOM = """
SELECT JSON_ARRAYAGG(JSON_ARRAY(f.channel, LEAST(f.n, f.most - f.running + f.n)))
INTO @sqlmq_room FROM (
    SELECT l.channel, l.n, """ + passing_limit() + """ AS most,
           (SELECT COUNT(*) FROM {m} AS r FORCE INDEX (ix_{m}_channel)
            WHERE r.channel = l.channel AND r.state = 'PROCESSING') AS running
    FROM (
        SELECT s.channel, COUNT(*) AS n
        FROM JSON_TABLE(%s, '$[*]' COLUMNS (id BIGINT PATH '$[0]', deliveries INT PATH '$[1]',
            channel VARCHAR({name_length}) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin
            PATH '$[2]')) AS s
        STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY)
            ON m.id = s.id AND m.deliveries_count = s.deliveries
        WHERE m.state = 'PROCESSING'
        GROUP BY s.channel
    ) AS l
    STRAIGHT_JOIN {channel} AS c FORCE INDEX (PRIMARY) ON c.name = l.channel
    LEFT JOIN {channel_default} AS d ON d.queue = c.queue
) AS f
WHERE f.most IS NOT NULL
"""

# Then, after the settle's writes: PASS_PICK locks each channel's next due messages in the
# queues ({queues}) in acquire order from the index (channel, priority DESC, channel_due_at,
# id), one PASS_PICK_PART per channel ({parts}, UNION_ALL; parameters: the channel, the
# queues, the most it could pass on), keeps as many as its room, and puts their ids and the
# clock into @sqlmq_take and @sqlmq_now. MariaDB takes no variable as a LIMIT, so each part
# is cut at the caller's bound and numbered; what it locks beyond the room is let go at the
# COMMIT. Then PASS_READ and PASS_TAKE as the fair acquire's (FAIR_READ and FAIR_TAKE, with
# the channel).
PASS_PICK = """
SELECT COALESCE(JSON_ARRAYAGG(n.id), '[]'), UTC_TIMESTAMP(6) INTO @sqlmq_take, @sqlmq_now
FROM (
    SELECT l.id, l.channel, ROW_NUMBER() OVER (
        PARTITION BY l.channel ORDER BY l.priority DESC, l.channel_due_at, l.id) AS rn
    FROM ({parts}) AS l
) AS n
JOIN JSON_TABLE(COALESCE(@sqlmq_room, '[]'), '$[*]' COLUMNS (
    channel VARCHAR({name_length}) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin
    PATH '$[0]', room INT PATH '$[1]')) AS r ON r.channel = n.channel
WHERE n.rn <= r.room
"""
PASS_PICK_PART = """
(SELECT id, channel, priority, channel_due_at FROM {m} FORCE INDEX (ix_{m}_channel_due)
 WHERE channel = %s AND state IN ('PENDING', 'RETRYABLE') AND queue IN ({queues})
   AND channel_due_at <= UTC_TIMESTAMP(6) AND queue NOT IN (SELECT queue FROM {pause})
 ORDER BY priority DESC, channel_due_at, id
 LIMIT %s
 FOR UPDATE SKIP LOCKED)"""

# Then PASS_HEADS: each ordered channel without other limits among the results (%s: the
# JSON array PASS_ROOM reads) whose head the settle deleted starts its first message in key
# order (the fair order), if that waits, is due in the queues ({queues}, parameters after
# the array) and is not blocked: a probe of the index (channel, fair_key, id) per channel.
# Channels of another kind are left out before their probe. The probe reads the channel's
# first entry, keyed or not: an unkeyed one (a message from before the channel was ordered)
# sorts first, and the conditions below drop it (``fair_key IS NOT NULL`` in the probe is no
# range MariaDB seeks in a correlated subquery: a limited channel's probe read past each of
# its messages, 3 ms a settle in bench.slot_cycle).
# Read without locks (its subquery reads the channel rows), into @sqlmq_heads; PASS_HEADS_LOCK
# locks those still waiting (SKIP LOCKED) and adds them to @sqlmq_take. After PASS_TAKE,
# FAIR_LET_IN lets the next ones in, as after the fair take of a head. The three are left out
# of the packet while the engine has seen no ordered channel (SlotPacket.settle_passing).
PASS_HEADS = """
SELECT JSON_ARRAYAGG(m.id) INTO @sqlmq_heads FROM (
    SELECT DISTINCT s.channel
    FROM JSON_TABLE(%s, '$[*]' COLUMNS (id BIGINT PATH '$[0]',
        channel VARCHAR({name_length}) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin
        PATH '$[2]')) AS s
    WHERE NOT EXISTS (SELECT 1 FROM {m} AS g FORCE INDEX (PRIMARY) WHERE g.id = s.id)
      AND """ + fair_kind("s") + """ = 1
) AS h
STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY) ON m.id = (
    SELECT o.id FROM {m} AS o FORCE INDEX (ix_{m}_channel_key)
    WHERE o.channel = h.channel ORDER BY o.fair_key, o.id LIMIT 1)
WHERE m.state IN ('PENDING', 'RETRYABLE') AND m.fair_key < {blocked}
  AND m.channel_due_at <= UTC_TIMESTAMP(6) AND m.queue IN ({queues})
  AND m.queue NOT IN (SELECT queue FROM {pause})
"""
PASS_HEADS_LOCK = _lock_waiting(
    "@sqlmq_heads", "JSON_MERGE_PRESERVE(COALESCE(@sqlmq_take, '[]'), "
    "COALESCE(JSON_ARRAYAGG(r.id), '[]')) INTO @sqlmq_take")

PASS_READ = _read("channel_due_at", ", m.channel")

PASS_TAKE = _take("channel_due_at")

# ---- leases (through SQLAlchemy) -------------------------------------------------------------

# Lock the held deliveries among :leases (a JSON array of [id, deliveries], sorted by id as
# settle's batch is, so the two cannot deadlock); returns their ids.
EXTEND_LOCK = """
SELECT m.id FROM JSON_TABLE(:leases, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]')) AS i
  STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY) ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING' FOR UPDATE
"""

# Push the leases of the locked rows (:ids, an expanding list) to now + :us microseconds.
EXTEND = """
UPDATE {m} SET lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL :us MICROSECOND WHERE id IN :ids
"""

# ---- maintenance (through SQLAlchemy) --------------------------------------------------------

# One recoverer at a time: a lock of the session (not the transaction), named :key, taken
# without waiting and released by hand (or by the server when the connection dies).
RECOVERY_LOCK = "SELECT GET_LOCK(:key, 0)"
RECOVERY_UNLOCK = "SELECT RELEASE_LOCK(:key)"

# Lock up to :limit messages whose lease expired, oldest expiry first.
RECOVER_EXPIRED_LOCK = """
SELECT id FROM {m} WHERE lease_expires_at < UTC_TIMESTAMP(6) AND state = 'PROCESSING'
ORDER BY lease_expires_at LIMIT :limit FOR UPDATE SKIP LOCKED
"""

# Return them (:ids, an expanding list) to PENDING, each ready within :spread seconds at
# random, recording the expiry in their history (which keeps its newest entries).
RECOVER_EXPIRED = """
UPDATE {m} SET
    state = 'PENDING',
    next_attempt_at = CASE WHEN channel IS NULL THEN UTC_TIMESTAMP(6)
                      + INTERVAL CAST(RAND() * :spread * 1000000 AS SIGNED) MICROSECOND END,
    channel_due_at = CASE WHEN channel IS NOT NULL THEN UTC_TIMESTAMP(6)
                     + INTERVAL CAST(RAND() * :spread * 1000000 AS SIGNED) MICROSECOND END,
    lease_expires_at = NULL,
    last_error = 'lease expired',
    history = CASE
        WHEN JSON_LENGTH(JSON_ARRAY_APPEND(COALESCE(history, '[]'), '$', JSON_OBJECT(
            'delivery', deliveries_count, 'ended', 'lease_expired',
            'at', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%dT%H:%i:%s.%f+00:00')))) > {history_limit}
        THEN JSON_REMOVE(JSON_ARRAY_APPEND(COALESCE(history, '[]'), '$', JSON_OBJECT(
            'delivery', deliveries_count, 'ended', 'lease_expired',
            'at', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%dT%H:%i:%s.%f+00:00'))), '$[0]')
        ELSE JSON_ARRAY_APPEND(COALESCE(history, '[]'), '$', JSON_OBJECT(
            'delivery', deliveries_count, 'ended', 'lease_expired',
            'at', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%dT%H:%i:%s.%f+00:00')))
    END
WHERE id IN :ids
"""

# Concurrent migrators of one prefix take turns (:key), waiting up to a minute.
MIGRATION_LOCK = "SELECT GET_LOCK(:key, 60)"
MIGRATION_UNLOCK = "SELECT RELEASE_LOCK(:key)"


# ---- the Spark source and sink (run by sqlmq/engines/spark/) -------------------------------
# Table names are filled by ``render(text, names)`` (``str.format``): ``{m}`` message,
# ``{spark_lease}``. Parameters are the driver's ``%s`` (PyMySQL, straight on the driver).
# The stream acquires with the engine's own lock and take statements, which leave the taken
# ids on the server in the session variable ``@sqlmq_take`` (a JSON array); the statements
# below read it, so the ids never travel to the client in between. The sink needs nothing of
# its own here: it publishes with SQLAlchemy Core, the same on every database but PostgreSQL.

#: Record the messages just taken (``@sqlmq_take``) as lease sequence ``%s`` of consumer
#: ``%s`` (parameters: the consumer, then the sequence), with the delivery each was taken
#: under.
SPARK_RECORD_LEASE = """
INSERT INTO {spark_lease} (consumer, seq, id, deliveries, attempts)
SELECT %s, %s, m.id, m.deliveries_count, m.attempts_count
FROM JSON_TABLE(@sqlmq_take, '$[*]' COLUMNS (id BIGINT PATH '$')) AS t
  STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY) ON m.id = t.id
"""

#: The messages just taken (``@sqlmq_take``) as ``(id, deliveries, attempts)``.
SPARK_READ_TAKEN = """
SELECT m.id, m.deliveries_count, m.attempts_count
FROM JSON_TABLE(@sqlmq_take, '$[*]' COLUMNS (id BIGINT PATH '$')) AS t
  STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY) ON m.id = t.id
"""

# ---- lists -----------------------------------------------------------------------------------

# A JSON array of names bound as :{key}, as rows: each name (v, compared as queue names
# are) and its place from 1 (i). The channel acquire's list of names to mark served
# (sql_lists.py).
LIST_ITEMS = """SELECT j.i, j.v FROM JSON_TABLE(:{key}, '$[*]' COLUMNS (i FOR ORDINALITY,
    v VARCHAR({name_length}) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin PATH '$')) AS j"""

# The results a settle keeps (sqlmq.engines.sql.results), written on their archive rows in
# one statement: a JSON array of [id, result in base64] bound as %s, the list first and each
# row found by its key (as SERVED_IN_ORDER). An UPDATE per result, sent one after another,
# was 280 ms of a 900-message flush.
KEEP_RESULTS = """UPDATE (SELECT j.id, j.r FROM JSON_TABLE(%s, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', r LONGTEXT PATH '$[1]')) AS j) AS j
    STRAIGHT_JOIN {a} AS a FORCE INDEX (PRIMARY) ON a.id = j.id SET a.result = FROM_BASE64(j.r)"""

# The channels marked served, each with its place in the list {items} (LIST_ITEMS): the list
# first, then each channel row by its key; left to choose, MariaDB read every channel row,
# locking each, and two processes deadlocked (sql_lists.served_in_order). FORCE INDEX: on a
# table whose statistics still say it is empty, a scan of it looks cheaper than the lookups.
SERVED_IN_ORDER = """UPDATE ({items}) AS j STRAIGHT_JOIN {channel} AS c FORCE INDEX (PRIMARY)
    ON c.name = j.v SET c.served_at = UTC_TIMESTAMP(6), c.served_rank = j.i"""

# ---- the archive's text search (schema version 26; see sqlmq.search) --------------------------

# What a search reads of an archived row: its header values but {unsearched} (their JSON
# array as text), then its error, the first {text_limit} characters, as its runs of
# letters and digits in lower case, in a stored column that a FULLTEXT index reads (InnoDB
# splits words at its own delimiters, keeping '_' in a word; here every word is already
# apart). NULL when there is nothing to search. Binary collation: 'é' is not 'e', as on
# the other databases. Headers a hand edit left no JSON object have no values: an
# expression that failed on them would fail the settle that archives the row.
SEARCH_COLUMN = r"""search_text TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin AS (NULLIF(TRIM(
    LOWER(REGEXP_REPLACE(LEFT(CONCAT_WS(' ', IF(JSON_VALID(headers), IF(JSON_TYPE(headers) =
    'OBJECT', JSON_EXTRACT(JSON_REMOVE(headers, '$."{unsearched}"'), '$.*'), NULL), NULL),
    error), {text_limit}), '[^\\p{{L}}\\p{{N}}]+', ' '))), '')) STORED"""
SEARCH_INDEX = "FULLTEXT INDEX ft_{a}_search (search_text)"
# Both at once: one rebuild of the archive, which holds writes to it meanwhile.
SEARCH_ADD = "ALTER TABLE {a} {additions}"
# The index keeps every word (stopwords are taken when it is made): 'the' or 'will' in a
# search must find the rows that have them, as elsewhere.
SEARCH_STOPWORDS = "SELECT @@SESSION.innodb_ft_enable_stopword"
SEARCH_STOPWORDS_SET = "SET SESSION innodb_ft_enable_stopword = {on}"
# Every word of :search (+word* each, in boolean mode) begins a word of the row's.
SEARCH_MATCH = "MATCH (search_text) AGAINST (:search IN BOOLEAN MODE)"
