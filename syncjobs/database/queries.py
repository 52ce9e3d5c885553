"""Every statement the database store runs, in one place, by name.

``{table}`` is the validated table name; ``{now}`` the database clock in epoch
seconds; ``{lock}`` the claim's row-locking clause; ``?`` a bound parameter.
"""

COLUMNS = "id, name, payload, context, attempt, max_attempts"

# A dispatch is INSERT_INTO followed by one INSERT_ROW per job, comma-separated.
INSERT_INTO = (
    "INSERT INTO {table} (id, queue, name, payload, context, state, attempt, max_attempts, run_at, created_at) VALUES"
)
INSERT_ROW = "(?, ?, ?, ?, ?, 'queued', 0, ?, {now} + ?, {now})"

# PostgreSQL: the insert and the NOTIFY that wakes other processes, in one statement.
INSERT_AND_NOTIFY = "WITH inserted AS ({insert} RETURNING id) SELECT pg_notify(?, (SELECT id FROM inserted LIMIT 1))"

SELECT_READY = (
    f"SELECT {COLUMNS} FROM {{table}} WHERE queue = ? AND state = 'queued' AND run_at <= {{now}} "
    "ORDER BY run_at LIMIT ?{lock}"
)

# The ids of one claim batch are bound one placeholder each: {ids} becomes "?, ?, ?".
MARK_CLAIMED = (
    "UPDATE {table} SET state = 'running', lease_owner = ?, lease_token = ?, lease_expires = {now} + ? "
    "WHERE id IN ({ids})"
)

# One round trip where the database has UPDATE … RETURNING (PostgreSQL,
# SQLite): the subquery's row locks (FOR UPDATE SKIP LOCKED on PostgreSQL)
# keep two claimers off the same rows; SQLite takes its write lock anyway.
CLAIM_RETURNING = (
    "UPDATE {table} SET state = 'running', lease_owner = ?, lease_token = ?, lease_expires = {now} + ? "
    "WHERE id IN (SELECT id FROM {table} WHERE queue = ? AND state = 'queued' AND run_at <= {now} "
    "ORDER BY run_at LIMIT ?{lock}) "
    f"RETURNING {COLUMNS}"
)

SELECT_EXPIRED = (
    f"SELECT {COLUMNS} FROM {{table}} WHERE queue = ? AND state = 'running' AND lease_expires < {{now}} LIMIT ?{{lock}}"
)

REQUEUE_EXPIRED = (
    "UPDATE {table} SET state = 'queued', attempt = ?, run_at = {now}, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND state = 'running'"
)

DEAD_EXPIRED = (
    "UPDATE {table} SET state = 'dead', attempt = ?, error = ?, finished_at = {now}, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND state = 'running'"
)

RENEW = "UPDATE {table} SET lease_expires = {now} + ? WHERE lease_owner = ? AND state = 'running'"

# Every state change below is fenced on the lease token: a worker that lost
# its lease changes nothing.
COMPLETE_MANY = "DELETE FROM {table} WHERE lease_token = ? AND id IN ({ids})"

PARK = (
    "UPDATE {table} SET state = 'queued', attempt = ?, run_at = {now} + ?, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND lease_token = ?"
)

DEAD = (
    "UPDATE {table} SET state = 'dead', attempt = ?, error = ?, finished_at = {now}, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND lease_token = ?"
)

NEXT_DUE = "SELECT MIN(run_at) - {now} FROM {table} WHERE queue = ? AND state = 'queued'"

READY = "SELECT COUNT(*) FROM {table} WHERE queue = ? AND state = 'queued' AND run_at <= {now}"

PENDING = "SELECT COUNT(*) FROM {table} WHERE queue = ? AND state IN ('queued', 'running')"

SCHEMA_VERSION = "SELECT MAX(version) FROM {table}_schema"

# -- what stats reads: live workers and jobs done per second ------------------

WORKER_UP = (
    "INSERT INTO {table}_workers (id, queue, host, pid, threads, lease, started_at, heartbeat_at) "
    "VALUES (?, ?, ?, ?, ?, ?, {now}, {now})"
)
WORKER_BEAT = "UPDATE {table}_workers SET heartbeat_at = {now} WHERE id = ?"
WORKER_DOWN = "DELETE FROM {table}_workers WHERE id = ?"
# A worker row whose heartbeat is older than its lease belongs to a dead worker.
WORKERS_PRUNE = "DELETE FROM {table}_workers WHERE heartbeat_at < {now} - lease"

# Added to by the completer in the transaction that deletes the finished rows.
COUNT_DONE = (
    "INSERT INTO {table}_done (queue, bucket, done) VALUES (?, ?, ?) "
    "ON CONFLICT (queue, bucket) DO UPDATE SET done = {table}_done.done + excluded.done"
)
COUNT_DONE_MYSQL = (
    "INSERT INTO {table}_done (queue, bucket, done) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE done = done + VALUES(done)"
)
DONE_PRUNE = "DELETE FROM {table}_done WHERE queue = ? AND bucket < ?"

# GROUP BY positions: the same on every database, unlike aliases.
STATS_JOBS = (
    "SELECT queue, state, CASE WHEN state = 'queued' AND run_at > {now} THEN 1 ELSE 0 END, COUNT(*), "
    "{now} - MIN(CASE WHEN state = 'queued' AND run_at <= {now} THEN run_at END) "
    "FROM {table} GROUP BY 1, 2, 3"
)
STATS_DONE = "SELECT queue, SUM(done) FROM {table}_done WHERE bucket >= ? GROUP BY queue"
STATS_WORKERS = (
    "SELECT id, queue, host, pid, threads, {now} - started_at, {now} - heartbeat_at FROM {table}_workers "
    "WHERE heartbeat_at >= {now} - lease ORDER BY queue, host, pid"
)

# -- dead letters, of one queue or all ----------------------------------------
# {queue_filter} is "" or " AND queue = ?", chosen by the caller: a NULL
# parameter meaning "any queue" has no type PostgreSQL could infer.

DEAD_COLUMNS = "id, queue, name, attempt, max_attempts, error, payload, context, created_at, finished_at"
DEAD_LIST = (
    f"SELECT {DEAD_COLUMNS}, {{now}} FROM {{table}} WHERE state = 'dead'{{queue_filter}} "
    "ORDER BY finished_at, id LIMIT ?"
)
DEAD_SHOW = f"SELECT {DEAD_COLUMNS}, {{now}} FROM {{table}} WHERE id = ? AND state = 'dead'{{queue_filter}}"
RETRY_DEAD = (
    "UPDATE {table} SET state = 'queued', attempt = 0, run_at = {now}, error = NULL, finished_at = NULL "
    "WHERE id = ? AND state = 'dead'{queue_filter}"
)
RETRY_DEAD_ALL = (
    "UPDATE {table} SET state = 'queued', attempt = 0, run_at = {now}, error = NULL, finished_at = NULL "
    "WHERE state = 'dead'{queue_filter}"
)
PURGE_DEAD = "DELETE FROM {table} WHERE state = 'dead' AND finished_at <= {now} - ?{queue_filter}"
