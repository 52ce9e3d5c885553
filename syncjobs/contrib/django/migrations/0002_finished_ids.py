"""Schema version 3: ``syncjobs_jobs_finished``, the ids of jobs finished in the last hour.

Running syncjobs' DDL again creates what is missing and keeps the rest, as
``syncjobs migrate`` does; on a database 0001 created just now, it changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from syncjobs.database.dialects import MYSQL, POSTGRES, SQLITE
from syncjobs.database.schema import ddl, record_version

TABLE = "syncjobs_jobs"
DIALECTS = {"postgresql": POSTGRES, "mysql": MYSQL, "sqlite": SQLITE}


def upgrade(apps: Any, schema_editor: Any) -> None:
    dialect = DIALECTS.get(schema_editor.connection.vendor)
    if dialect is None:
        return
    for statement in [*ddl(dialect, TABLE), *record_version(TABLE)]:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0001_initial")]

    operations = [
        migrations.RunPython(upgrade, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
