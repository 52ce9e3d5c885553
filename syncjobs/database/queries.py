"""Every statement the database store runs, in one place, by name.

``{table}`` is the validated table name; ``{now}`` the database clock in epoch
seconds, ``{now_once}`` the same read once per statement (for WHERE clauses);
``{lock}`` the claim's row-locking clause; ``{ready_index}`` what makes a
claim read the claim index; ``?`` a bound parameter.
"""

COLUMNS = "id, name, payload, context, attempt, max_attempts"

# A claimed row is 'running' once its run may have started (it was claimed for
# a worker that was waiting, or MARK_STARTED ran after a prefetched one was
# handed over), 'claimed' while it waits in a worker process's buffer: lease
# recovery spends an attempt for the first kind only. A 'claimed' row it puts
# back keeps lease_token = 'unstarted', and its next claim makes it 'running'
# at once: a job that kills its worker before its mark was written spends an
# attempt at the latest on its next run.
LEASED = "('running', 'claimed')"
# A row going back to the queue that cancel() flagged meanwhile ends cancelled instead.
REQUEUED_STATE = "CASE WHEN cancel_requested > 0 THEN 'cancelled' ELSE 'queued' END"
REQUEUED_FINISHED = "CASE WHEN cancel_requested > 0 THEN {now} ELSE finished_at END"
# A run whose cancel was asked for ends cancelled even when it failed for good.
DEAD_STATE = "CASE WHEN cancel_requested > 0 THEN 'cancelled' ELSE 'dead' END"
CLAIM_STATE = "CASE WHEN lease_token IS NULL THEN ? ELSE 'running' END"

# A dispatch is INSERT_INTO followed by one INSERT_ROW per job, comma-separated.
INSERT_INTO = (
    "INSERT INTO {table} (id, queue, name, payload, context, state, attempt, max_attempts, priority, run_at, "
    "created_at) VALUES"
)
INSERT_ROW = "(?, ?, ?, ?, ?, 'queued', 0, ?, ?, {now} + ?, {now})"

# PostgreSQL: the insert and the NOTIFY that wakes other processes, in one statement.
INSERT_AND_NOTIFY = "WITH inserted AS ({insert} RETURNING id) SELECT pg_notify(?, (SELECT id FROM inserted LIMIT 1))"

# A dispatch retried after an ambiguous failure (its first try may have
# committed): rows already there are kept, and rows whose job already finished
# (a tombstone in {table}_finished) are not inserted again. See intake.py.
INSERT_IF_ABSENT = " ON CONFLICT (id) DO NOTHING RETURNING id"
NOTIFY = "SELECT pg_notify(?, ?)"
# MySQL: a locking read of the ids takes gap locks on the absent ones, so a
# first try still in flight can neither commit nor finish before this one.
LOCK_IDS = "SELECT id FROM {table} WHERE id IN ({ids}) FOR UPDATE"
FINISHED_IDS = "SELECT id FROM {table}_finished WHERE id IN ({ids})"
DELETE_IDS = "DELETE FROM {table} WHERE id IN ({ids})"

# Tombstones of finished jobs, written by the completer with its deletes and
# kept for an hour: far longer than any dispatch retries.
FINISHED_INTO = "INSERT INTO {table}_finished (id, finished_at) VALUES"
FINISHED_ROW = "(?, {now})"
FINISHED_ON_CONFLICT = " ON CONFLICT (id) DO NOTHING"
FINISHED_ON_CONFLICT_MYSQL = " ON DUPLICATE KEY UPDATE id = id"
FINISHED_PRUNE = "DELETE FROM {table}_finished WHERE finished_at < {now_once} - ?"

MAX_ALLOWED_PACKET = "SELECT @@max_allowed_packet"

# A claim reads the ready rows in the claim index's order, the highest
# priority first, then by due time: from the start, or (_FROM_FLOOR) past the
# rows this process took last, those of one priority from a due time on
# (claim_floor.py). It returns each row's due time and priority after the
# columns of its envelope.
_FROM_START = "queue = ? AND state = 'queued' AND run_at <= {now_once} ORDER BY priority DESC, run_at LIMIT ?{lock}"
_FROM_FLOOR = (
    "queue = ? AND state = 'queued' AND priority = ? AND run_at >= ? AND run_at <= {now_once} "
    "ORDER BY run_at LIMIT ?{lock}"
)
_CLAIMED = f"{COLUMNS}, run_at, priority"
SELECT_READY = f"SELECT {_CLAIMED} FROM {{table}}{{ready_index}} WHERE " + _FROM_START
SELECT_READY_FLOOR = f"SELECT {_CLAIMED} FROM {{table}}{{ready_index}} WHERE " + _FROM_FLOOR

# The ids of one claim batch are bound one placeholder each: {ids} becomes "?, ?, ?".
MARK_CLAIMED = (
    "UPDATE {table} SET state = " + CLAIM_STATE + ", lease_owner = ?, lease_token = ?, "
    "lease_expires = {now} + ?, started_at = {now}, progress = NULL WHERE id IN ({ids})"
)

# One round trip where the database has UPDATE … RETURNING (PostgreSQL,
# SQLite): the subquery's row locks (FOR UPDATE SKIP LOCKED on PostgreSQL)
# keep two claimers off the same rows; SQLite takes its write lock anyway.
_CLAIM_SET = (
    "UPDATE {table} SET state = " + CLAIM_STATE + ", lease_owner = ?, lease_token = ?, lease_expires = {now} + ?, "
    "started_at = {now}, progress = NULL WHERE id IN (SELECT id FROM {table}{ready_index} WHERE "
)
CLAIM_RETURNING = _CLAIM_SET + _FROM_START + f") RETURNING {_CLAIMED}"
CLAIM_RETURNING_FLOOR = _CLAIM_SET + _FROM_FLOOR + f") RETURNING {_CLAIMED}"

# PostgreSQL: the rows taken from the buffer marked running, in the claim's statement.
# Rows the completer is deleting (locked) are skipped: their runs are over,
# and waiting for them would only put the two in each other's way.
_MARK_STARTED_FIRST = (
    "WITH started AS (UPDATE {table} SET state = 'running', started_at = {now} WHERE id IN (SELECT id FROM {table} "
    "WHERE id = ANY(?) AND lease_token = ANY(?) AND state = 'claimed' FOR UPDATE SKIP LOCKED)) "
)
MARK_AND_CLAIM = _MARK_STARTED_FIRST + CLAIM_RETURNING
MARK_AND_CLAIM_FLOOR = _MARK_STARTED_FIRST + CLAIM_RETURNING_FLOOR

# The claim token fences it: a row given up meanwhile is not marked.
MARK_STARTED = (
    "UPDATE {table} SET state = 'running', started_at = {now} "
    "WHERE lease_token = ? AND state = 'claimed' AND id IN ({ids})"
)
# MySQL: the rows to mark, locked first, skipping those the completer is deleting.
MARK_SELECT = (
    "SELECT id FROM {table} WHERE lease_token = ? AND state = 'claimed' AND id IN ({ids}) FOR UPDATE SKIP LOCKED"
)

SELECT_EXPIRED = (
    f"SELECT {COLUMNS}, state FROM {{table}} WHERE queue = ? AND state IN {LEASED} AND lease_expires < {{now_once}} "
    "LIMIT ?{lock}"
)

REQUEUE_UNSTARTED = (
    "UPDATE {table} SET state = " + REQUEUED_STATE + ", finished_at = " + REQUEUED_FINISHED + ", run_at = {now}, "
    "lease_owner = NULL, lease_token = 'unstarted', lease_expires = NULL WHERE id = ? AND state = 'claimed'"
)

REQUEUE_EXPIRED = (
    "UPDATE {table} SET state = " + REQUEUED_STATE + ", finished_at = " + REQUEUED_FINISHED + ", attempt = ?, "
    "run_at = {now}, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND state IN ('running', 'claimed')"
)

DEAD_EXPIRED = (
    "UPDATE {table} SET state = " + DEAD_STATE + ", attempt = ?, error = ?, finished_at = {now}, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND state IN ('running', 'claimed')"
)

# A row that cannot be decoded: dead, with what could be read of its counts
# written back as numbers, so that the dead-letter views can read it.
POISON = (
    "UPDATE {table} SET state = " + DEAD_STATE + ", attempt = ?, max_attempts = ?, error = ?, finished_at = {now}, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND lease_token = ?"
)
POISON_EXPIRED = (
    "UPDATE {table} SET state = " + DEAD_STATE + ", attempt = ?, max_attempts = ?, error = ?, finished_at = {now}, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND state IN ('running', 'claimed')"
)

# Only the leases this process still holds, by token ({tokens} becomes "?, ?"):
# a row whose claim reply was lost, or whose outcome was given up, expires.
RENEW = (
    f"UPDATE {{table}} SET lease_expires = {{now}} + ? WHERE lease_owner = ? AND state IN {LEASED} "
    "AND lease_token IN ({tokens})"
)

# Every state change below is fenced on the lease token: a worker that lost
# its lease changes nothing.
COMPLETE_MANY = "DELETE FROM {table} WHERE lease_token = ? AND id IN ({ids})"

PARK = (
    "UPDATE {table} SET state = " + REQUEUED_STATE + ", finished_at = " + REQUEUED_FINISHED + ", attempt = ?, "
    "run_at = {now} + ?, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND lease_token = ?"
)

DEAD = (
    "UPDATE {table} SET state = " + DEAD_STATE + ", attempt = ?, error = ?, traceback = ?, finished_at = {now}, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND lease_token = ?"
)

# The first waiting row of the highest priority below ?, and how soon it is due: the earliest of each
# priority, read off the claim index one priority after the other (no due-time index of its own, which
# would be one more index to write at every dispatch and claim).
NEXT_DUE = (
    "SELECT priority, run_at - {now} FROM {table}{ready_index} WHERE queue = ? AND state = 'queued' "
    "AND priority < ? ORDER BY priority DESC, run_at LIMIT 1"
)

READY = "SELECT COUNT(*) FROM {table} WHERE queue = ? AND state = 'queued' AND run_at <= {now_once}"

PENDING = "SELECT COUNT(*) FROM {table} WHERE queue = ? AND state IN ('queued', 'running', 'claimed')"

SCHEMA_VERSION = "SELECT MAX(version) FROM {table}_schema"

# -- what stats reads: live workers and jobs done per second ------------------

# An upsert: start() and the heartbeat's first beat may list the same worker at once.
WORKER_UP = (
    "INSERT INTO {table}_workers (id, queue, host, pid, threads, lease, started_at, heartbeat_at) "
    "VALUES (?, ?, ?, ?, ?, ?, {now}, {now}) ON CONFLICT (id) DO UPDATE SET "
    "threads = excluded.threads, lease = excluded.lease, started_at = excluded.started_at, "
    "heartbeat_at = excluded.heartbeat_at"
)
WORKER_UP_MYSQL = (
    "INSERT INTO {table}_workers (id, queue, host, pid, threads, lease, started_at, heartbeat_at) "
    "VALUES (?, ?, ?, ?, ?, ?, {now}, {now}) ON DUPLICATE KEY UPDATE "
    "threads = VALUES(threads), lease = VALUES(lease), started_at = VALUES(started_at), "
    "heartbeat_at = VALUES(heartbeat_at)"
)
WORKER_BEAT = "UPDATE {table}_workers SET heartbeat_at = {now} WHERE id = ?"
WORKER_DOWN = "DELETE FROM {table}_workers WHERE id = ?"
# A worker row whose heartbeat is older than its lease belongs to a dead worker.
WORKERS_PRUNE = "DELETE FROM {table}_workers WHERE heartbeat_at < {now_once} - lease"

# Done jobs' records, for status(): written with their deletes, pruned once expired.
RESULT_COLUMNS = (
    "id, queue, name, state, attempts, max_attempts, result, progress, created_at, started_at, finished_at, "
    "expires_at, payload, priority"
)
# Elsewhere, before the delete and fenced like it: {results}, {progress} and
# {keeps} are CASE id WHEN ? THEN ? … END over the batch's ids, {ids} their placeholders.
KEEP_RESULTS = (
    "INSERT INTO {table}_results (" + RESULT_COLUMNS + ") "
    "SELECT id, queue, name, 'done', attempt + 1, max_attempts, {results}, COALESCE({progress}, progress), "
    "created_at, started_at, {now}, {now} + {keeps}, payload, priority FROM {table} "
    "WHERE lease_token = ? AND id IN ({ids})"
)
RESULTS_PRUNE = "DELETE FROM {table}_results WHERE expires_at < {now_once}"

# One job's record, wherever it is: a row of the jobs table (unfinished, or
# dead), else a kept result that has not expired.
STATUS = (
    "SELECT name, state, attempt, max_attempts, error, NULL, created_at, started_at, finished_at, run_at, progress, "
    "{now}, queue, payload, priority, traceback FROM {table} WHERE id = ? UNION ALL "
    "SELECT name, state, attempts, max_attempts, NULL, result, created_at, started_at, finished_at, NULL, progress, "
    "{now}, queue, payload, COALESCE(priority, 0), NULL FROM {table}_results WHERE id = ? AND expires_at >= {now}"
)

# cancel(): a waiting job ends at once (a claim takes only 'queued' rows);
# one a worker holds is flagged, for that worker's heartbeat to see. The
# flag counts up, so that MySQL (which counts changed rows) says it matched.
CANCEL_WAITING = "UPDATE {table} SET state = 'cancelled', finished_at = {now} WHERE id = ? AND state = 'queued'"
CANCEL_RUNNING = (
    f"UPDATE {{table}} SET cancel_requested = COALESCE(cancel_requested, 0) + 1 WHERE id = ? AND state IN {LEASED}"
)
HOLDER = f"SELECT lease_owner, lease_token FROM {{table}} WHERE id = ? AND state IN {LEASED}"
CANCEL_REQUESTS = (
    f"SELECT id, lease_token FROM {{table}} WHERE lease_owner = ? AND cancel_requested > 0 AND state IN {LEASED}"
)
# A cancelled run has ended: fenced like DEAD.
CANCELLED = (
    "UPDATE {table} SET state = 'cancelled', attempt = ?, progress = COALESCE(?, progress), finished_at = {now}, "
    "lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND lease_token = ?"
)
# Cancelled jobs stay in the jobs table (as dead letters do) until pruned.
# PostgreSQL: an end that result() may wait for, with the NOTIFY that wakes it
# (the rows it changed, as a fenced write counts them).
DEAD_NOTIFY = "WITH changed AS (" + DEAD + " RETURNING 1) SELECT (SELECT COUNT(*) FROM changed), pg_notify(?, '')"
CANCELLED_NOTIFY = (
    "WITH changed AS (" + CANCELLED + " RETURNING 1) SELECT (SELECT COUNT(*) FROM changed), pg_notify(?, '')"
)
CANCELLED_PRUNE = "DELETE FROM {table} WHERE queue = ? AND state = 'cancelled' AND finished_at < {now_once} - ?"
PROGRESS = "UPDATE {table} SET progress = ? WHERE id = ? AND lease_token = ?"

# Added to by the completer in the transaction that deletes the finished rows.
# PostgreSQL: COMPLETE_MANY, FINISHED_INTO and COUNT_DONE in one statement,
# each row fenced on its own lease token (ids and tokens as two arrays).
COMPLETE_RECORD_COUNT = (
    "WITH gone AS (DELETE FROM {table} AS j "
    "USING unnest(?::text[], ?::text[], ?::text[], ?::float8[], ?::text[]) AS t(id, token, result, keep, progress) "
    "WHERE j.id = t.id AND j.lease_token = t.token "
    "RETURNING j.id, j.queue, j.name, j.attempt, j.max_attempts, j.created_at, j.started_at, t.result, t.keep, "
    "j.payload, j.priority, "
    "COALESCE(t.progress, j.progress) AS progress), "
    "recorded AS (INSERT INTO {table}_finished (id, finished_at) SELECT id, {now} FROM gone "
    "ON CONFLICT (id) DO NOTHING), "
    "kept AS (INSERT INTO {table}_results (" + RESULT_COLUMNS + ") "
    "SELECT id, queue, name, 'done', attempt + 1, max_attempts, result, progress, created_at, started_at, {now}, "
    "{now} + keep, payload, priority FROM gone WHERE keep > 0 ON CONFLICT (id) DO NOTHING), "
    "counted AS (INSERT INTO {table}_done (queue, bucket, done) SELECT ?, ?, COUNT(*) FROM gone "
    "HAVING COUNT(*) > 0 ON CONFLICT (queue, bucket) DO UPDATE SET done = {table}_done.done + excluded.done) "
    # The NOTIFY wakes result() waiting in any process; delivered at commit, one per batch.
    "SELECT (SELECT COUNT(*) FROM gone), pg_notify(?, '')"
)
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

# The dashboard's job list: the jobs table's rows and the kept records of done
# jobs, each as STATUS reads one (the id first), newest first. {filter} and
# {result_filter} are fixed conditions the caller chooses (admin.JOB_STATES), with
# " AND name = ?" and " AND queue = ?" when it filters by them: no text of a
# request reaches the statement.
JOBS_LIST = (
    "SELECT * FROM (SELECT id, name, state, attempt, max_attempts, error, NULL AS result, created_at, started_at, "
    "finished_at, run_at, progress, {now} AS now_at, queue, payload, priority, traceback FROM {table} "
    "WHERE {filter} UNION ALL "
    "SELECT id, name, state, attempts, max_attempts, NULL, result, created_at, started_at, finished_at, NULL, "
    "progress, {now}, queue, payload, COALESCE(priority, 0), NULL FROM {table}_results "
    "WHERE expires_at >= {now_once} AND {result_filter}) listed ORDER BY created_at DESC, id DESC LIMIT ?"
)
# Each limit key in use: its queue, its runs-at-once limit, a job name of those
# with a permit (the key itself is a digest), and its permits by kind: held (or
# kept for a job let go), waiting, booked (a rate's turn); when its rate next
# lets a run begin. The dashboard's limits page.
LIMITS_LIST = (
    "SELECT l.queue, l.limit_key, l.running, MIN(j.name), "
    "SUM(CASE WHEN p.kind IN ('held', 'let_go') THEN 1 ELSE 0 END), "
    "SUM(CASE WHEN p.kind = 'waiting' THEN 1 ELSE 0 END), "
    "SUM(CASE WHEN p.kind = 'booked' THEN 1 ELSE 0 END), l.next_at - {now} "
    "FROM {table}_limits l LEFT JOIN {table}_permits p ON p.limit_key = l.limit_key "
    "LEFT JOIN {table} j ON j.id = p.job_id "
    "GROUP BY l.queue, l.limit_key, l.running, l.next_at ORDER BY l.queue, l.limit_key"
)
# Jobs done per second over the last hour, all queues or one: the dashboard's throughput chart.
DONE_SINCE = "SELECT bucket, SUM(done) FROM {table}_done WHERE bucket >= ?{queue_filter} GROUP BY bucket"

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
    "UPDATE {table} SET state = 'queued', attempt = 0, run_at = {now}, error = NULL, traceback = NULL, "
    "finished_at = NULL, "
    "cancel_requested = NULL "
    "WHERE id = ? AND state = 'dead'{queue_filter}"
)
RETRY_DEAD_ALL = (
    "UPDATE {table} SET state = 'queued', attempt = 0, run_at = {now}, error = NULL, traceback = NULL, "
    "finished_at = NULL, "
    "cancel_requested = NULL "
    "WHERE state = 'dead'{queue_filter}"
)
# Every row of one queue, whatever its state, in each table that has one: for a queue nobody serves any more.
DELETE_QUEUE = "DELETE FROM {table}{suffix} WHERE queue = ?"

# `syncjobs prune`: what the workers of each queue delete as they go (CANCELLED_PRUNE,
# DONE_PRUNE), for every queue at once.
PRUNE_CANCELLED = "DELETE FROM {table} WHERE state = 'cancelled' AND finished_at < {now_once} - ?"
PRUNE_DONE_COUNTS = "DELETE FROM {table}_done WHERE bucket < ?"

# The dead letters that died at least ? seconds ago: what a purge deletes, and what it asks about first.
_DEAD_SINCE = "WHERE state = 'dead' AND finished_at <= {now_once} - ?{queue_filter}"
PURGE_DEAD = "DELETE FROM {table} " + _DEAD_SINCE
COUNT_DEAD = "SELECT COUNT(*) FROM {table} " + _DEAD_SINCE

# -- unique jobs' keys (unique_keys.py) -------------------------------------------
# One row per key (the SHA-256 of a job's NAME and key): the job that took it,
# how it holds, and for seconds=, until when. Taken by inserting it; a key
# that is there already is read, and taken over only if its job holds it no longer.

UNIQUE_TAKE = (
    "INSERT INTO {table}_unique (unique_key, job_id, holds, expires_at) VALUES (?, ?, ?, {now} + ?) "
    "ON CONFLICT (unique_key) DO NOTHING"
)
# An exclusive lock on the row that is there (INSERT IGNORE's shared one would
# deadlock two dispatchers that both go on to take it over).
UNIQUE_TAKE_MYSQL = (
    "INSERT INTO {table}_unique (unique_key, job_id, holds, expires_at) VALUES (?, ?, ?, {now} + ?) "
    "ON DUPLICATE KEY UPDATE job_id = job_id"
)
UNIQUE_HOLDER = (
    "SELECT job_id, holds, CASE WHEN expires_at > {now} THEN 1 ELSE 0 END FROM {table}_unique WHERE unique_key = ?"
)
UNIQUE_HOLDER_LOCKED = UNIQUE_HOLDER + " FOR UPDATE"
# Read after the key's row is locked, so that it sees the job of whoever took it last.
UNIQUE_HOLDER_STATE = "SELECT state FROM {table} WHERE id = ?"
# A waiting holder, share-locked until the dispatch commits (and, on MySQL, read as it is now).
UNIQUE_HOLDER_WAITS = UNIQUE_HOLDER_STATE + " FOR SHARE"
UNIQUE_HOLDER_WAITS_MYSQL = UNIQUE_HOLDER_STATE + " LOCK IN SHARE MODE"
UNIQUE_RETAKE = "UPDATE {table}_unique SET job_id = ?, holds = ?, expires_at = {now} + ? WHERE unique_key = ?"
# Pruning: keys no job holds any more. Expired ones by their index; the others a page at a time, in
# key order from where the last page ended, looking up their jobs. Each is then deleted by key and
# job id (one taken over meanwhile is kept), and only if no dispatch holds it locked (SKIP LOCKED:
# a caller's open transaction never stalls the workers' housekeeping).
UNIQUE_EXPIRED = "SELECT unique_key, job_id FROM {table}_unique WHERE expires_at < {now_once} LIMIT ?"
UNIQUE_PAGE = (
    "SELECT unique_key, job_id FROM {table}_unique WHERE unique_key > ? AND expires_at IS NULL "
    "ORDER BY unique_key LIMIT ?"
)
UNIQUE_JOBS_ALIVE = f"SELECT id FROM {{table}} WHERE id IN ({{ids}}) AND state IN ('queued', {LEASED[1:]}"
UNIQUE_FORGET_LOCK = (
    "SELECT unique_key FROM {table}_unique WHERE unique_key IN ({keys}) AND job_id IN ({ids}) FOR UPDATE SKIP LOCKED"
)
UNIQUE_FORGET = "DELETE FROM {table}_unique WHERE unique_key IN ({keys}) AND job_id IN ({ids})"
# MySQL: by the primary key, whatever the optimizer makes of the list: a scan would wait for every
# row a dispatch holds locked (a DELETE has no semi-consistent read to pass them by).
UNIQUE_FORGET_MYSQL = (
    "DELETE u FROM {table}_unique AS u FORCE INDEX (PRIMARY) WHERE u.unique_key IN ({keys}) AND u.job_id IN ({ids})"
)

# -- periodic jobs: each schedule's last slot dispatched (schedule_records.py) -------

SCHEDULES_LAST = "SELECT name, last_slot FROM {table}_schedules WHERE queue = ? AND last_slot IS NOT NULL"
# A schedule no process has run yet, listed with no last slot; a row there already is kept.
SCHEDULE_ANNOUNCE = (
    "INSERT INTO {table}_schedules (id, queue, name, description, last_slot, next_slot, updated_at) "
    "VALUES (?, ?, ?, ?, NULL, ?, {now}) ON CONFLICT (id) DO NOTHING"
)
SCHEDULE_ANNOUNCE_MYSQL = (
    "INSERT INTO {table}_schedules (id, queue, name, description, last_slot, next_slot, updated_at) "
    "VALUES (?, ?, ?, ?, NULL, ?, {now}) ON DUPLICATE KEY UPDATE id = id"
)
# Kept if later: processes that dispatch the same slots record them in any order.
_LATER = "({table}_schedules.last_slot IS NULL OR excluded.last_slot >= {table}_schedules.last_slot)"
SCHEDULE_RECORD = (
    "INSERT INTO {table}_schedules (id, queue, name, description, last_slot, next_slot, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, {now}) ON CONFLICT (id) DO UPDATE SET description = excluded.description, "
    "next_slot = CASE WHEN {later} THEN excluded.next_slot ELSE {table}_schedules.next_slot END, "
    "last_slot = CASE WHEN {later} THEN excluded.last_slot ELSE {table}_schedules.last_slot END, "
    "updated_at = excluded.updated_at"
).replace("{later}", _LATER)
# MySQL assigns left to right: next_slot is compared with last_slot before that changes.
SCHEDULE_RECORD_MYSQL = (
    "INSERT INTO {table}_schedules (id, queue, name, description, last_slot, next_slot, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, {now}) ON DUPLICATE KEY UPDATE description = VALUES(description), "
    "next_slot = IF(last_slot IS NULL OR VALUES(last_slot) >= last_slot, VALUES(next_slot), next_slot), "
    "last_slot = IF(last_slot IS NULL OR VALUES(last_slot) >= last_slot, VALUES(last_slot), last_slot), "
    "updated_at = VALUES(updated_at)"
)
# What `syncjobs schedules` and stats list: every queue's, or one's ({queue_filter}).
SCHEDULES_LIST = (
    "SELECT queue, name, description, last_slot, next_slot, {now} FROM {table}_schedules WHERE 1 = 1{queue_filter} "
    "ORDER BY queue, name"
)

# -- concurrency and rate limits: see permits.py ------------------------------------

# A limit key's row, locked by every claim and let-go that counts its permits.
LIMIT_ENSURE = (
    "INSERT INTO {table}_limits (limit_key, queue, running, next_at, booked_until) VALUES (?, ?, ?, 0, 0) "
    "ON CONFLICT (limit_key) DO NOTHING"
)
LIMIT_ENSURE_MYSQL = (
    "INSERT INTO {table}_limits (limit_key, queue, running, next_at, booked_until) VALUES (?, ?, ?, 0, 0) "
    "ON DUPLICATE KEY UPDATE limit_key = limit_key"
)
LIMIT_READ = "SELECT running, next_at, booked_until, {now} FROM {table}_limits WHERE limit_key = ?"
LIMIT_WRITE = "UPDATE {table}_limits SET running = ?, next_at = ?, booked_until = ? WHERE limit_key = ?"
# Keys of a queue nothing needs any more (no permit, no rate turn to come): each deleted under its lock.
LIMITS_UNUSED = (
    "SELECT limit_key FROM {table}_limits WHERE queue = ? AND booked_until < {now_once} - 60 AND NOT EXISTS "
    "(SELECT 1 FROM {table}_permits p WHERE p.limit_key = {table}_limits.limit_key) LIMIT 100"
)
LIMIT_USED = "SELECT COUNT(*) FROM {table}_permits WHERE limit_key = ?"
LIMIT_DELETE = "DELETE FROM {table}_limits WHERE limit_key = ?"
LIMITS_ANY = "SELECT limit_key FROM {table}_limits WHERE queue = ? LIMIT 1"

# Whose claims the admission acts on: the rows still leased by the claim that took them.
PERMITS_STILL_CLAIMED = f"SELECT id FROM {{table}} WHERE id IN ({{ids}}) AND lease_token = ? AND state IN {LEASED}"
PERMITS_OF = "SELECT job_id, kind, run_at FROM {table}_permits WHERE job_id IN ({ids})"
# The key's permits in use, with their jobs as they are (a plain read: it locks no job row).
PERMITS_IN_USE = (
    "SELECT p.job_id, p.kind, p.lease_token, j.state, j.lease_token FROM {table}_permits p "
    "LEFT JOIN {table} j ON j.id = p.job_id WHERE p.limit_key = ? AND p.kind IN ('held', 'let_go')"
)
PERMITS_ANY_WAITING = "SELECT job_id FROM {table}_permits WHERE limit_key = ? AND kind = 'waiting' LIMIT 1"
PERMIT_DROP = "DELETE FROM {table}_permits WHERE job_id = ?"
PERMIT_PUT = (
    "INSERT INTO {table}_permits (job_id, limit_key, kind, lease_token, priority, run_at) VALUES (?, ?, ?, ?, ?, ?)"
)
# A claimed row over its limit goes back to wait, its run not begun (fenced on its claim).
PERMIT_WAIT = (
    "UPDATE {table} SET state = " + REQUEUED_STATE + ", finished_at = " + REQUEUED_FINISHED + ", run_at = ?, "
    "started_at = NULL, lease_owner = NULL, lease_token = NULL, lease_expires = NULL WHERE id = ? AND lease_token = ?"
)
PERMITS_WAITING = (
    "SELECT job_id, run_at FROM {table}_permits WHERE limit_key = ? AND kind = 'waiting' "
    "ORDER BY priority DESC, run_at LIMIT ?"
)
# The job let go: due again at its due time of before (it keeps its place), if it still waits.
PERMIT_LET_GO = "UPDATE {table} SET run_at = ? WHERE id = ? AND state = 'queued' AND run_at >= ?"
PERMIT_KIND = "UPDATE {table}_permits SET kind = ? WHERE job_id = ?"
PERMITS_WAITING_KEYS = (
    "SELECT DISTINCT p.limit_key FROM {table}_permits p JOIN {table}_limits l ON l.limit_key = p.limit_key "
    "WHERE p.kind = 'waiting' AND l.queue = ? AND p.limit_key > ? ORDER BY p.limit_key LIMIT ?"
)
# A page of permits, for housekeeping's look for those of jobs gone (held) or no longer live (the others).
# Those a claim or a let-go holds locked are skipped: they are looked at by the next round.
PERMITS_PAGE = "SELECT job_id FROM {table}_permits WHERE job_id > ? ORDER BY job_id LIMIT ?"
PERMITS_PRUNE = (
    "DELETE FROM {table}_permits WHERE job_id IN ({ids}) AND NOT EXISTS (SELECT 1 FROM {table} j "
    "WHERE j.id = {table}_permits.job_id AND ({table}_permits.kind = 'held' OR j.state IN ('queued', "
    f"{LEASED[1:]}))"
)
