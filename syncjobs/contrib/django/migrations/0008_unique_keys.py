"""Schema version 7: ``syncjobs_jobs_unique``, the keys of unique jobs and the jobs that hold them.

As 0002 and 0004: syncjobs' own DDL again, which adds what is missing and keeps the rest.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from syncjobs.contrib.django.ddl import TABLE, run_ddl


def drop_table(apps: Any, schema_editor: Any) -> None:
    schema_editor.execute(f"DROP TABLE IF EXISTS {TABLE}_unique", params=None)


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0007_priorities")]

    operations = [
        migrations.RunPython(run_ddl, drop_table, atomic=False, elidable=False),
    ]
