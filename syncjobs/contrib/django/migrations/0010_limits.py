"""Schema version 9: ``syncjobs_jobs_limits`` and ``syncjobs_jobs_permits``, for concurrency and rate limits.

As 0002 and 0004: syncjobs' own DDL again, which adds what is missing and keeps the rest.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from syncjobs.contrib.django.ddl import TABLE, run_ddl


def drop_tables(apps: Any, schema_editor: Any) -> None:
    for suffix in ("_permits", "_limits"):
        schema_editor.execute(f"DROP TABLE IF EXISTS {TABLE}{suffix}", params=None)


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0009_schedules")]

    operations = [
        migrations.RunPython(run_ddl, drop_tables, atomic=False, elidable=False),
    ]
