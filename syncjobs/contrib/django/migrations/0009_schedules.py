"""Schema version 8: ``syncjobs_jobs_schedules``, each periodic job's last slot dispatched; the admin lists it.

As 0002 and 0004: syncjobs' own DDL again, which adds what is missing and
keeps the rest; then the admin's unmanaged model of the new table.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

from syncjobs.contrib.django.ddl import TABLE, run_ddl


def drop_table(apps: Any, schema_editor: Any) -> None:
    schema_editor.execute(f"DROP TABLE IF EXISTS {TABLE}_schedules", params=None)


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0008_unique_keys")]

    operations = [
        migrations.RunPython(run_ddl, drop_table, atomic=False, elidable=False),
        migrations.CreateModel(
            name="ScheduleRecord",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=100)),
                ("name", models.CharField(max_length=200)),
                ("description", models.CharField(max_length=255)),
                ("last_slot", models.FloatField(null=True)),
                ("next_slot", models.FloatField()),
                ("updated_at", models.FloatField()),
            ],
            options={
                "verbose_name": "schedule",
                "db_table": "syncjobs_jobs_schedules",
                "ordering": ("queue", "name"),
                "managed": False,
            },
        ),
    ]
