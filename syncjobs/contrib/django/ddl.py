"""The migrations' one operation on syncjobs' tables: run syncjobs' own DDL, as ``syncjobs migrate`` does."""

from __future__ import annotations

from typing import Any

from syncjobs.database.dialects import MYSQL, POSTGRES, SQLITE
from syncjobs.database.schema import install, record_version

TABLE = "syncjobs_jobs"
DIALECTS = {"postgresql": POSTGRES, "mysql": MYSQL, "sqlite": SQLITE}


def run_ddl(apps: Any, schema_editor: Any) -> None:
    """Create what is missing and keep the rest (every statement is idempotent); record the schema version."""
    dialect = DIALECTS.get(schema_editor.connection.vendor)
    if dialect is None:
        return  # a database syncjobs cannot use: nothing to create there
    with schema_editor.connection.cursor() as cursor:
        install(dialect, TABLE, cursor)
    for statement in record_version(TABLE):
        schema_editor.execute(statement, params=None)
