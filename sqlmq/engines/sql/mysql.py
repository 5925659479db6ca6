"""MySQL 8 and MariaDB 10.6+ statements. ``%s`` parameters: sent straight to the driver
(the hot path's packets, see :mod:`sqlmq.engines.mysql`); ``:name`` parameters: run through
SQLAlchemy's ``text()`` (off the hot path). Table names are filled in once by
:func:`sqlmq.engines.sql.render`.

The database clock is ``UTC_TIMESTAMP(6)``. A packet that needs a transaction opens and
commits it itself (``BEGIN`` … ``COMMIT``), so that the COMMIT travels with its statements;
state shared between the statements of one packet stays on the server in session variables
(``@sqlmq_ready``, ``@sqlmq_now``, ``@sqlmq_take``, ``@sqlmq_settle``).
"""

# ---- transactions of one packet --------------------------------------------------------------

BEGIN = "START TRANSACTION"
COMMIT = "COMMIT"

# ---- publishing ------------------------------------------------------------------------------

# Publish one message (%s queue, headers, payload, delay in microseconds, priority): the
# INSERT commits by itself; LAST_ID, in the same packet, reads its id.
INSERT_ONE = """
INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, next_attempt_at, priority)
VALUES (%s, %s, %s, 'PENDING', 0, 0, UTC_TIMESTAMP(6),
        UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, %s)
"""
LAST_ID = "SELECT LAST_INSERT_ID()"

# Publish one message already acquired, for an idle subscriber of this process: the row an
# acquire would leave, at one clock reading (INSERT_LEASED_CLOCK, then INSERT_LEASED with
# %s queue, headers, payload, lease in microseconds, priority, then INSERT_LEASED_READ: id
# and clock).
INSERT_LEASED_CLOCK = "SET @sqlmq_now = UTC_TIMESTAMP(6)"
INSERT_LEASED = """
INSERT INTO {m} (queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, first_attempt_at, acquired_at, next_attempt_at, lease_expires_at,
                 priority)
VALUES (%s, %s, %s, 'PROCESSING', 0, 1, @sqlmq_now, @sqlmq_now, @sqlmq_now, NULL,
        @sqlmq_now + INTERVAL %s MICROSECOND, %s)
"""
INSERT_LEASED_READ = "SELECT LAST_INSERT_ID(), CAST(@sqlmq_now AS DATETIME(6))"

# ---- consuming: acquire, one packet, one transaction ----------------------------------------

# 1. Whether any of the queues (one %s each in {queues}, see MysqlEngine._lock_ready) has a
#    ready message, into @sqlmq_ready: one entry of the due index (queue, next_attempt_at)
#    at most, a plain read that locks nothing. The ready index cannot tell as cheaply: with
#    no skip scan of its descending priority, a scan for ready rows walks every delayed
#    entry of each priority level (100,000 delayed messages: 250 ms to find nothing).
ACQUIRE_PROBE = """
SELECT EXISTS (
    SELECT 1 FROM {m} FORCE INDEX (ix_{m}_due)
    WHERE queue IN ({queues}) AND next_attempt_at <= UTC_TIMESTAMP(6)
) INTO @sqlmq_ready
"""

# 2. Lock up to %s ready rows of the queues (as in ACQUIRE_PROBE), highest priority first,
#    then in ready order, reading the ready index only (forced: a plan on the due index
#    would sort every ready row, locking them all), and keep their ids and the clock in
#    session variables. Parameters: the queues, then the limit. When ACQUIRE_PROBE found
#    nothing, @sqlmq_ready (a constant to the optimizer) makes the WHERE impossible and
#    nothing is read. Still slow, and left so: ready messages behind many delayed ones of a
#    higher priority (100,000 delayed at priority 9 before ready ones at 0: about 270 ms).
ACQUIRE_LOCK = """
SELECT JSON_ARRAYAGG(id), UTC_TIMESTAMP(6) INTO @sqlmq_take, @sqlmq_now FROM (
    SELECT id FROM {m} FORCE INDEX (ix_{m}_ready)
    WHERE @sqlmq_ready AND queue IN ({queues}) AND next_attempt_at <= UTC_TIMESTAMP(6)
    ORDER BY priority DESC, next_attempt_at, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
) AS r
"""

# 3. Return the locked rows as they are now, the clock, and their priority.
ACQUIRE_READ = """
SELECT m.id, m.queue, m.headers, m.payload, m.attempts_count, m.deliveries_count,
       m.created_at, m.first_attempt_at, m.next_attempt_at, m.history,
       CAST(@sqlmq_now AS DATETIME(6)), m.priority
FROM JSON_TABLE(@sqlmq_take, '$[*]' COLUMNS (id BIGINT PATH '$')) AS t
STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY) ON m.id = t.id
"""

# 4. Mark them PROCESSING, leased for %s microseconds.
ACQUIRE_TAKE = """
UPDATE JSON_TABLE(@sqlmq_take, '$[*]' COLUMNS (id BIGINT PATH '$')) AS t
STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY) ON m.id = t.id SET
    m.state = 'PROCESSING',
    m.deliveries_count = m.deliveries_count + 1,
    m.acquired_at = CAST(@sqlmq_now AS DATETIME(6)),
    m.first_attempt_at = COALESCE(m.first_attempt_at, CAST(@sqlmq_now AS DATETIME(6))),
    m.next_attempt_at = NULL,
    m.lease_expires_at = CAST(@sqlmq_now AS DATETIME(6)) + INTERVAL %s MICROSECOND
"""

# JSON_ARRAYAGG is cut at group_concat_max_len bytes on MariaDB: an acquire takes at most as
# many ids as fit (see MysqlEngine._id_list_limit).
GROUP_CONCAT_MAX_LEN = "SELECT @@group_concat_max_len"

# ---- consuming: settle, one packet, one transaction -----------------------------------------
#
# The batch is one JSON value (see SqlEngine.settlement_json: id, deliveries, outcome, error,
# delay, refund, attempted, history), put in a session variable once and opened by each
# statement. The batch drives every join, by primary key (STRAIGHT_JOIN, FORCE INDEX): on a
# small table the optimizer would rather scan it, locking rows that are not in the batch and
# deadlocking with acquire.

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

# Copy the batch's COMPLETED and FAILED rows to the archive.
SETTLE_ARCHIVE = """
INSERT INTO {a} (id, queue, headers, payload, state, attempts_count, deliveries_count,
                 created_at, first_attempt_at, last_attempt_at, archived_at, error, history,
                 priority)
SELECT m.id, m.queue, m.headers, m.payload, i.outcome, m.attempts_count + i.attempt,
       m.deliveries_count, m.created_at, m.first_attempt_at,
       CASE WHEN i.attempt = 1 THEN UTC_TIMESTAMP(6) ELSE m.last_attempt_at END,
       UTC_TIMESTAMP(6), i.error, COALESCE(i.history, m.history), m.priority
FROM JSON_TABLE(@sqlmq_settle, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]', outcome VARCHAR(10) PATH '$[2]',
    error LONGTEXT PATH '$[3]', delay DOUBLE PATH '$[4]', refund INT PATH '$[5]',
    attempt INT PATH '$[6]', history LONGTEXT PATH '$[7]'
)) AS i STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY)
    ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED')
"""

# Delete the rows just archived.
SETTLE_DELETE = """
DELETE m FROM JSON_TABLE(@sqlmq_settle, '$[*]' COLUMNS (
    id BIGINT PATH '$[0]', deliveries INT PATH '$[1]', outcome VARCHAR(10) PATH '$[2]',
    error LONGTEXT PATH '$[3]', delay DOUBLE PATH '$[4]', refund INT PATH '$[5]',
    attempt INT PATH '$[6]', history LONGTEXT PATH '$[7]'
)) AS i STRAIGHT_JOIN {m} AS m FORCE INDEX (PRIMARY)
    ON m.id = i.id AND m.deliveries_count = i.deliveries
WHERE m.state = 'PROCESSING' AND i.outcome IN ('COMPLETED', 'FAILED')
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
    m.next_attempt_at = UTC_TIMESTAMP(6)
                        + INTERVAL CAST(i.delay * 1000000 AS SIGNED) MICROSECOND,
    m.lease_expires_at = NULL,
    m.last_error = COALESCE(i.error, m.last_error),
    m.history = COALESCE(i.history, m.history)
WHERE m.state = 'PROCESSING' AND i.outcome IN ('RETRY', 'RELEASE')
"""

SETTLE_CLEAR = "SET @sqlmq_settle = NULL"

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
    next_attempt_at = UTC_TIMESTAMP(6)
                      + INTERVAL CAST(RAND() * :spread * 1000000 AS SIGNED) MICROSECOND,
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
