"""The admin's view of ``syncjobs_jobs_results`` (done jobs' records): an unmanaged model, so no DDL here.

The table itself is syncjobs' own, made by 0004 (schema version 4).
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0004_results")]

    operations = [
        migrations.CreateModel(
            name="FinishedJob",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=100)),
                ("name", models.CharField(max_length=200)),
                ("state", models.CharField(max_length=10)),
                ("attempts", models.IntegerField()),
                ("max_attempts", models.IntegerField()),
                ("result", models.TextField(null=True)),
                ("progress", models.TextField(null=True)),
                ("created_at", models.FloatField()),
                ("started_at", models.FloatField(null=True)),
                ("finished_at", models.FloatField()),
                ("expires_at", models.FloatField()),
            ],
            options={
                "verbose_name": "finished job",
                "db_table": "syncjobs_jobs_results",
                "ordering": ("-finished_at", "id"),
                "managed": False,
            },
        ),
    ]
