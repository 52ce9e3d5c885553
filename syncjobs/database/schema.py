"""The jobs table, its indexes, and the schema version a later release migrates from."""

from __future__ import annotations

from .dialects import MYSQL, Dialect

#: Bumped by any change to the table; stored in ``<table>_schema``.
SCHEMA_VERSION = 1


def ddl(dialect: Dialect, table: str) -> list[str]:
    """The statements that create the table and its indexes, each idempotent."""
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
        name VARCHAR(200) NOT NULL,
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
        finished_at {real}"""
    meta = f"CREATE TABLE IF NOT EXISTS {table}_schema (version INTEGER NOT NULL)"
    if dialect is MYSQL:
        # MySQL has no CREATE INDEX IF NOT EXISTS: the indexes go in the table.
        inline = ",".join(f"\n        INDEX {name} ({cols})" for name, cols in indexes)
        return [
            f"CREATE TABLE IF NOT EXISTS {table} ({columns},{inline}\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
            meta,
        ]
    return [
        f"CREATE TABLE IF NOT EXISTS {table} ({columns}\n)",
        *(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({cols})" for name, cols in indexes),
        meta,
    ]
