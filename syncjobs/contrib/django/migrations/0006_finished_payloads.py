"""Schema version 5: ``payload`` on ``syncjobs_jobs_results``, so a done job's record says what it was asked.

As 0002 and 0004: syncjobs' own DDL again, which adds what is missing and
keeps the rest; then the admin's unmanaged model learns the column.
"""

from __future__ import annotations

from django.db import migrations, models

from syncjobs.contrib.django.ddl import run_ddl


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0005_finished_jobs")]

    operations = [
        migrations.RunPython(run_ddl, migrations.RunPython.noop, atomic=False, elidable=False),
        migrations.AddField(model_name="finishedjob", name="payload", field=models.TextField(null=True)),
    ]
