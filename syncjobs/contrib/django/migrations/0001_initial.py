"""syncjobs' tables, created with syncjobs' own DDL (the same as ``syncjobs migrate``), and the task results."""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

from syncjobs.contrib.django.ddl import TABLE, run_ddl


def drop_tables(apps: Any, schema_editor: Any) -> None:
    for suffix in ("_finished", "_done", "_workers", "_schema", ""):
        schema_editor.execute(f"DROP TABLE IF EXISTS {TABLE}{suffix}", params=None)


class Migration(migrations.Migration):
    initial = True
    dependencies = []

    operations = [
        # Not atomic: MySQL cannot roll DDL back, and each statement is idempotent.
        migrations.RunPython(run_ddl, drop_tables, atomic=False, elidable=False),
        migrations.CreateModel(
            name="QueuedJob",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=100)),
                ("name", models.CharField(max_length=200)),
                ("payload", models.TextField()),
                ("context", models.TextField(null=True)),
                ("state", models.CharField(max_length=10)),
                ("attempt", models.IntegerField()),
                ("max_attempts", models.IntegerField()),
                ("run_at", models.FloatField()),
                ("lease_owner", models.CharField(max_length=64, null=True)),
                ("lease_token", models.CharField(max_length=64, null=True)),
                ("lease_expires", models.FloatField(null=True)),
                ("error", models.TextField(null=True)),
                ("created_at", models.FloatField()),
                ("finished_at", models.FloatField(null=True)),
            ],
            options={
                "verbose_name": "job",
                "db_table": "syncjobs_jobs",
                "ordering": ("run_at", "id"),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="TaskResultRecord",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("backend", models.CharField(max_length=100)),
                ("task_path", models.CharField(max_length=300)),
                ("queue_name", models.CharField(max_length=100)),
                ("priority", models.IntegerField(default=0)),
                ("takes_context", models.BooleanField(default=False)),
                ("run_after", models.DateTimeField(null=True)),
                ("status", models.CharField(default="READY", max_length=10)),
                ("args", models.JSONField(default=list)),
                ("kwargs", models.JSONField(default=dict)),
                ("enqueued_at", models.DateTimeField(null=True)),
                ("started_at", models.DateTimeField(null=True)),
                ("finished_at", models.DateTimeField(null=True)),
                ("last_attempted_at", models.DateTimeField(null=True)),
                ("return_value", models.JSONField(null=True)),
                ("errors", models.JSONField(default=list)),
                ("worker_ids", models.JSONField(default=list)),
            ],
            options={"verbose_name": "task result", "db_table": "syncjobs_task_results"},
        ),
    ]
