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

PENDING = "SELECT COUNT(*) FROM {table} WHERE queue = ? AND state IN ('queued', 'running')"

DEAD_LETTERS = (
    "SELECT id, name, payload, attempt, error FROM {table} WHERE queue = ? AND state = 'dead' "
    "ORDER BY finished_at, id LIMIT ?"
)

RETRY_DEAD = (
    "UPDATE {table} SET state = 'queued', attempt = 0, run_at = {now}, error = NULL, finished_at = NULL "
    "WHERE id = ? AND queue = ? AND state = 'dead'"
)

PURGE_DEAD = "DELETE FROM {table} WHERE queue = ? AND state = 'dead' AND finished_at <= {now} - ?"

SCHEMA_VERSION = "SELECT version FROM {table}_schema"
SET_SCHEMA_VERSION = "INSERT INTO {table}_schema (version) VALUES (?)"
