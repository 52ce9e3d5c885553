"""Schema version 4: ``started_at`` on the jobs table, and ``syncjobs_jobs_results`` (done jobs' records).

As 0002: syncjobs' own DDL again, which adds what is missing and keeps the rest.
"""

from __future__ import annotations

from django.db import migrations

from syncjobs.contrib.django.ddl import run_ddl


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0003_often_vacuumed")]

    operations = [
        migrations.RunPython(run_ddl, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
