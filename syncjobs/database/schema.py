"""The jobs table, its companions, and the schema version that ``migrate`` upgrades from."""

from __future__ import annotations

from typing import Any

from ..job import MAX_NAME_LENGTH
from .dialects import MYSQL, POSTGRES, Dialect

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
SCHEMA_VERSION = 5

#: Seconds a finished job's id is kept in ``<table>_finished`` (far longer than any dispatch retries),
#: and a per-second count of done jobs in ``<table>_done`` (for stats).
FINISHED_KEPT = 3600.0
DONE_COUNTS_KEPT = 3600

#: Columns added to a table after it was created: (table suffix, name, type) by version.
#: ``CREATE TABLE`` has them; :func:`add_columns` adds them to an older table.
_ADDED_COLUMNS = [
    ("", "started_at", "real"),
    ("", "progress", "text"),
    ("", "cancel_requested", "INTEGER"),
    ("_results", "payload", "text"),
]


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
    """The statements that create every table and index, each idempotent.

    Upgrading is running them again: each version only adds tables, so what
    exists is kept and what is missing is created.
    """
    key, real = dialect.text_key, dialect.real
    text = "LONGTEXT" if dialect is MYSQL else "TEXT"
    # The claim reads (queue, state, run_at) in order; lease recovery reads
    # (state, lease_expires); the heartbeat updates by lease_owner.
    indexes = [
        (f"{table}_claim", "queue, state, run_at"),
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
        cancel_requested INTEGER"""
    engine = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4" if dialect is MYSQL else ""
    finished_index = f",\n        INDEX {table}_finished_at (finished_at)" if dialect is MYSQL else ""
    expires_index = f",\n        INDEX {table}_results_expires (expires_at)" if dialect is MYSQL else ""
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
        payload {text}{expires_index}
){engine}""",
    ]
    if dialect is MYSQL:
        # MySQL has no CREATE INDEX IF NOT EXISTS: the indexes go in the table.
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
    ]


def add_columns(dialect: Dialect, table: str, cursor: Any) -> None:
    """Add to the existing tables the columns later versions gave them; idempotent."""
    for suffix, column, kind in _ADDED_COLUMNS:
        _add_column(dialect, f"{table}{suffix}", column, kind, cursor)


def _add_column(dialect: Dialect, table: str, column: str, kind: str, cursor: Any) -> None:
    sql_type = {"real": dialect.real, "text": "LONGTEXT" if dialect is MYSQL else "TEXT"}.get(kind, kind)
    # Looked up first: ALTER TABLE locks the whole table, even when it has the column already.
    if dialect is POSTGRES:
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s AND column_name = %s",
            (table.lower(), column),  # an unquoted name is folded to lower case
        )
    elif dialect is MYSQL:
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name = %s AND column_name = %s",
            (table, column),
        )
    else:
        pragma = f"SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = ?"  # noqa: S608 - a validated identifier
        cursor.execute(pragma, (column,))
    if not cursor.fetchone()[0]:
        exists = " IF NOT EXISTS" if dialect is POSTGRES else ""  # SQLite and MySQL have none
        cursor.execute(f"ALTER TABLE {table} ADD COLUMN{exists} {column} {sql_type}")


def record_version(table: str) -> list[str]:
    """The statements that record :data:`SCHEMA_VERSION` (a constant, never user input)."""
    return [
        f"DELETE FROM {table}_schema",  # noqa: S608 - a validated identifier
        f"INSERT INTO {table}_schema (version) VALUES ({SCHEMA_VERSION})",  # noqa: S608 - and a constant
    ]
