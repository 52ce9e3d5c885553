"""The jobs table, its companions, and the schema version that ``migrate`` upgrades from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..job import MAX_NAME_LENGTH
from .dialects import MYSQL, POSTGRES, SQLITE, Dialect

#: Bumped by any change to the tables; stored in ``<table>_schema``.
#: 1: the jobs table. 2: adds ``<table>_workers`` (live workers and their
#: heartbeats) and ``<table>_done`` (jobs done per second, for ``stats``).
#: 3: adds ``<table>_finished`` (tombstones of finished jobs, so that a
#: dispatch retried after an ambiguous failure never runs a finished job again).
#: 4: adds ``started_at``, ``progress`` and ``cancel_requested`` to the jobs
#: table, and ``<table>_results`` (done jobs' records and results, kept
#: ``keep_result`` seconds, for ``status()``). 5: adds ``payload`` to
#: ``<table>_results``, so that a done job's record still says what it was
#: asked to do (the Django Tasks backend's ``get_result()`` answers its arguments).
#: 6: adds ``priority`` to the jobs table and ``<table>_results``, and the
#: claim's index ``<table>_ready`` (queue, state, priority DESC, run_at).
#: 7: adds ``<table>_unique`` (unique jobs' keys and the jobs that hold them).
#: 8: adds ``<table>_schedules`` (each periodic job's last slot dispatched, and its next).
#: 9: adds ``<table>_limits`` and ``<table>_permits`` (concurrency and rate limits: see permits.py).
#: 10: adds ``traceback`` to the jobs table (where a dead job's last run raised, for its status and the dashboard).
SCHEMA_VERSION = 10

#: The tables beside the jobs table, by the suffix of their names.
COMPANIONS = ("_schema", "_workers", "_done", "_finished", "_results", "_unique", "_schedules", "_limits", "_permits")

#: Seconds a finished job's id is kept in ``<table>_finished`` (far longer than any dispatch retries),
#: and a per-second count of done jobs in ``<table>_done`` (for stats).
FINISHED_KEPT = 3600.0
DONE_COUNTS_KEPT = 3600

#: Columns added to a table after it was created: (table suffix, name, type) by version.
#: ``CREATE TABLE`` has them; :func:`install` adds them to an older table (:func:`_upgrades`).
_ADDED_COLUMNS = [
    ("", "started_at", "real"),
    ("", "progress", "text"),
    ("", "cancel_requested", "INTEGER"),
    ("_results", "payload", "text"),
    ("", "priority", "INTEGER NOT NULL DEFAULT 0"),
    ("_results", "priority", "INTEGER"),
    ("", "traceback", "text"),
]
#: Indexes added to the jobs table after it was created: (name suffix, columns).
#: The claim reads the ready rows of a queue, the highest priority first,
#: then by due time: one ordered range of this index (DESC, so that MySQL and
#: MariaDB 10.8+ read it in that order too).
_ADDED_INDEXES = [("_ready", "queue, state, priority DESC, run_at")]
#: Indexes of earlier versions that no query reads any more (each is written at every dispatch and
#: claim): dropped once what replaces them is there. ``_claim`` (queue, state, run_at), until version 5.
_RETIRED_INDEXES = ["_claim"]
#: A key's permits by kind, the waiting ones in the order they go.
_PERMITS_KEY = "limit_key, kind, priority DESC, run_at"


# PostgreSQL: every job leaves dead tuples (its claim's UPDATE and its
# DELETE). Autovacuum's default waits for 20% of the table's rows, a long
# wait on a table that is small between bursts and huge during them; a queue
# table is vacuumed after 1,000 dead tuples and 1% of its rows. (Not a new
# schema version: nothing depends on it, and ``migrate`` applies it to a
# table of any version, under a lock that lets reads and writes go on.) No
# fillfactor: no claim or renewal can be a HOT update, as each changes an
# indexed column.
_OFTEN_VACUUMED = "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000"


def ddl(dialect: Dialect, table: str) -> list[str]:
    """The statements that create every table and index, each idempotent, in the order a new database needs.

    Upgrading an older table is :func:`install`: each version only adds
    tables, columns and indexes, so what exists is kept and what is missing is
    created.
    """
    return [*_tables(dialect, table), *_late_indexes(dialect, table)]


def install(dialect: Dialect, table: str, cursor: Any, run: Callable[[str], object] | None = None) -> None:
    """Create what is missing of every table, column and index; keep the rest. Idempotent.

    With ``run``, the statements go to it instead of being executed (what
    ``migrate --sql`` prints): which ones depends on what ``cursor`` finds.
    """
    execute = cursor.execute if run is None else run
    for statement in _tables(dialect, table):
        execute(statement)
    for statement in _upgrades(dialect, table, cursor):  # before the indexes on the columns they add
        execute(statement)
    for statement in _late_indexes(dialect, table):
        execute(statement)
    for statement in _retirements(dialect, table, cursor):
        execute(statement)


def _retirements(dialect: Dialect, table: str, cursor: Any) -> list[str]:
    """The statements that drop the indexes of :data:`_RETIRED_INDEXES` the table still has."""
    statements: list[str] = []
    for suffix in _RETIRED_INDEXES:
        name = f"{table}{suffix}"
        if _count(dialect, cursor, "index", table, name):
            # IF EXISTS: another process migrating at once may have dropped it meanwhile (MySQL has none).
            statements.append(
                f"ALTER TABLE {table} DROP INDEX {name}" if dialect is MYSQL else f"DROP INDEX IF EXISTS {name}"
            )
    return statements


def _late_indexes(dialect: Dialect, table: str) -> list[str]:
    """The indexes of :data:`_ADDED_INDEXES` (MySQL has them in its ``CREATE TABLE``, and from :func:`_upgrades`)."""
    if dialect is MYSQL:
        return []
    return [f"CREATE INDEX IF NOT EXISTS {table}{suffix} ON {table} ({cols})" for suffix, cols in _ADDED_INDEXES]


def _tables(dialect: Dialect, table: str) -> list[str]:
    key, real = dialect.text_key, dialect.real
    text = "LONGTEXT" if dialect is MYSQL else "TEXT"
    # The claim reads (queue, state, priority DESC, run_at) in order (an index of
    # _ADDED_INDEXES), and so does the look for the next due row; lease recovery
    # reads (state, lease_expires); the heartbeat updates by lease_owner.
    indexes = [
        (f"{table}_lease", "state, lease_expires"),
        (f"{table}_owner", "lease_owner"),
    ]
    columns = f"""
        id {key} NOT NULL PRIMARY KEY,
        queue VARCHAR(100) NOT NULL,
        name VARCHAR({MAX_NAME_LENGTH}) NOT NULL,
        payload {text} NOT NULL,
        context {text},
        state VARCHAR(10) NOT NULL,
        attempt INTEGER NOT NULL,
        max_attempts INTEGER NOT NULL,
        run_at {real} NOT NULL,
        lease_owner {key},
        lease_token {key},
        lease_expires {real},
        error {text},
        created_at {real} NOT NULL,
        finished_at {real},
        started_at {real},
        progress {text},
        cancel_requested INTEGER,
        priority INTEGER NOT NULL DEFAULT 0,
        traceback {text}"""
    engine = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4" if dialect is MYSQL else ""
    finished_index = f",\n        INDEX {table}_finished_at (finished_at)" if dialect is MYSQL else ""
    expires_index = f",\n        INDEX {table}_results_expires (expires_at)" if dialect is MYSQL else ""
    unique_expires_index = f",\n        INDEX {table}_unique_expires (expires_at)" if dialect is MYSQL else ""
    permits_index = f",\n        INDEX {table}_permits_key ({_PERMITS_KEY})" if dialect is MYSQL else ""
    companions = [
        f"CREATE TABLE IF NOT EXISTS {table}_schema (version INTEGER NOT NULL){engine}",
        # One row per worker process (per queue it serves), renewed by its heartbeat.
        f"""CREATE TABLE IF NOT EXISTS {table}_workers (
        id {key} NOT NULL PRIMARY KEY,
        queue VARCHAR(100) NOT NULL,
        host VARCHAR(255) NOT NULL,
        pid INTEGER NOT NULL,
        threads INTEGER NOT NULL,
        lease {real} NOT NULL,
        started_at {real} NOT NULL,
        heartbeat_at {real} NOT NULL
){engine}""",
        # Finished rows are deleted, so "done in the last minute" is counted
        # here: one row per queue and second, pruned after an hour.
        f"""CREATE TABLE IF NOT EXISTS {table}_done (
        queue VARCHAR(100) NOT NULL,
        bucket BIGINT NOT NULL,
        done INTEGER NOT NULL,
        PRIMARY KEY (queue, bucket)
){engine}""",
        # The ids of jobs finished (and deleted) in the last hour; pruned by finished_at.
        f"""CREATE TABLE IF NOT EXISTS {table}_finished (
        id {key} NOT NULL PRIMARY KEY,
        finished_at {real} NOT NULL{finished_index}
){engine}""",
        # Done jobs, for status() and result(): pruned once past expires_at.
        f"""CREATE TABLE IF NOT EXISTS {table}_results (
        id {key} NOT NULL PRIMARY KEY,
        queue VARCHAR(100) NOT NULL,
        name VARCHAR({MAX_NAME_LENGTH}) NOT NULL,
        state VARCHAR(10) NOT NULL,
        attempts INTEGER NOT NULL,
        max_attempts INTEGER NOT NULL,
        result {text},
        progress {text},
        created_at {real} NOT NULL,
        started_at {real},
        finished_at {real} NOT NULL,
        expires_at {real} NOT NULL,
        payload {text},
        priority INTEGER{expires_index}
){engine}""",
        # Unique jobs' keys (SHA-256, hex): a primary key, so that no two
        # dispatchers, in any processes, take one at once. See unique_keys.py.
        f"""CREATE TABLE IF NOT EXISTS {table}_unique (
        unique_key CHAR(64) NOT NULL PRIMARY KEY,
        job_id {key} NOT NULL,
        holds VARCHAR(10) NOT NULL,
        expires_at {real}{unique_expires_index}
){engine}""",
        # One row per queue and schedule: the last slot a process dispatched, and the next. Its id is
        # the SHA-256 of [queue, name]: one key column, as Django's admin (which lists them) needs.
        f"""CREATE TABLE IF NOT EXISTS {table}_schedules (
        id CHAR(64) NOT NULL PRIMARY KEY,
        queue VARCHAR(100) NOT NULL,
        name VARCHAR({MAX_NAME_LENGTH}) NOT NULL,
        description VARCHAR(255) NOT NULL,
        last_slot {real},
        next_slot {real} NOT NULL,
        updated_at {real} NOT NULL
){engine}""",
        # One row per limit key: the lock that every claim and let-go counting its permits takes, its
        # runs at once (as the last claim had it), and by the database's clock the earliest its rate
        # lets the next run begin and the first turn not yet booked.
        f"""CREATE TABLE IF NOT EXISTS {table}_limits (
        limit_key CHAR(64) NOT NULL PRIMARY KEY,
        queue VARCHAR(100) NOT NULL,
        running INTEGER,
        next_at {real} NOT NULL,
        booked_until {real} NOT NULL
){engine}""",
        # A permit per job with a limit key that holds one ('held', by its claim's lease token), waits
        # for one ('waiting', with its priority and due time: the first goes first), was let go and has
        # one kept for it ('let_go'), or has a rate's turn booked ('booked').
        f"""CREATE TABLE IF NOT EXISTS {table}_permits (
        job_id {key} NOT NULL PRIMARY KEY,
        limit_key CHAR(64) NOT NULL,
        kind VARCHAR(8) NOT NULL,
        lease_token {key},
        priority INTEGER NOT NULL,
        run_at {real} NOT NULL{permits_index}
){engine}""",
    ]
    if dialect is MYSQL:
        # MySQL has no CREATE INDEX IF NOT EXISTS: the indexes go in the table.
        indexes += [(f"{table}{suffix}", cols) for suffix, cols in _ADDED_INDEXES]
        inline = ",".join(f"\n        INDEX {name} ({cols})" for name, cols in indexes)
        return [f"CREATE TABLE IF NOT EXISTS {table} ({columns},{inline}\n){engine}", *companions]
    vacuum = [f"ALTER TABLE {table} SET ({_OFTEN_VACUUMED})"] if dialect is POSTGRES else []
    return [
        f"CREATE TABLE IF NOT EXISTS {table} ({columns}\n)",
        *vacuum,
        *(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({cols})" for name, cols in indexes),
        *companions,
        f"CREATE INDEX IF NOT EXISTS {table}_finished_at ON {table}_finished (finished_at)",
        f"CREATE INDEX IF NOT EXISTS {table}_results_expires ON {table}_results (expires_at)",
        f"CREATE INDEX IF NOT EXISTS {table}_unique_expires ON {table}_unique (expires_at)",
        f"CREATE INDEX IF NOT EXISTS {table}_permits_key ON {table}_permits ({_PERMITS_KEY})",
    ]


def _upgrades(dialect: Dialect, table: str, cursor: Any) -> list[str]:
    """The statements that add to existing tables the columns (on MySQL, the indexes) later versions gave them.

    Looked up first: ALTER TABLE locks the whole table, even when it has the
    column already. A table not there yet is left to its ``CREATE TABLE``.
    """
    statements: list[str] = []
    for suffix, column, kind in _ADDED_COLUMNS:
        name = f"{table}{suffix}"
        if _count(dialect, cursor, "table", name) and not _count(dialect, cursor, "column", name, column):
            sql_type = {"real": dialect.real, "text": "LONGTEXT" if dialect is MYSQL else "TEXT"}.get(kind, kind)
            exists = " IF NOT EXISTS" if dialect is POSTGRES else ""  # SQLite and MySQL have none
            statements.append(f"ALTER TABLE {name} ADD COLUMN{exists} {column} {sql_type}")
    if dialect is MYSQL and _count(dialect, cursor, "table", table):
        for suffix, cols in _ADDED_INDEXES:
            if not _count(dialect, cursor, "index", table, f"{table}{suffix}"):
                statements.append(f"ALTER TABLE {table} ADD INDEX {table}{suffix} ({cols})")
    return statements


#: How each database says whether a table, a column of it or (MySQL) an index of it exists.
_LOOKUPS = {
    (POSTGRES, "table"): "SELECT COUNT(*) FROM information_schema.tables "
    "WHERE table_schema = current_schema() AND table_name = %s",
    (POSTGRES, "column"): "SELECT COUNT(*) FROM information_schema.columns "
    "WHERE table_schema = current_schema() AND table_name = %s AND column_name = %s",
    (
        MYSQL,
        "table",
    ): "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = %s",
    (MYSQL, "column"): "SELECT COUNT(*) FROM information_schema.columns "
    "WHERE table_schema = DATABASE() AND table_name = %s AND column_name = %s",
    (MYSQL, "index"): "SELECT COUNT(*) FROM information_schema.statistics "
    "WHERE table_schema = DATABASE() AND table_name = %s AND index_name = %s",
    (POSTGRES, "index"): "SELECT COUNT(*) FROM pg_indexes "
    "WHERE schemaname = current_schema() AND tablename = %s AND indexname = %s",
    (SQLITE, "table"): "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
    (SQLITE, "index"): "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND name = ?",
    (SQLITE, "column"): "SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?",
}


def _count(dialect: Dialect, cursor: Any, kind: str, table: str, *names: str) -> int:
    # PostgreSQL folds an unquoted name to lower case; the others keep it.
    args = (table, *names)
    cursor.execute(_LOOKUPS[dialect, kind], tuple(a.lower() for a in args) if dialect is POSTGRES else args)
    return int(cursor.fetchone()[0])


def record_version(table: str) -> list[str]:
    """The statements that record :data:`SCHEMA_VERSION` (a constant, never user input)."""
    return [
        f"DELETE FROM {table}_schema",  # noqa: S608 - a validated identifier
        f"INSERT INTO {table}_schema (version) VALUES ({SCHEMA_VERSION})",  # noqa: S608 - and a constant
    ]
