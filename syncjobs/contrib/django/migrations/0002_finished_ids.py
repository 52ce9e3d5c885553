"""Schema version 3: ``syncjobs_jobs_finished``, the ids of jobs finished in the last hour.

Running syncjobs' DDL again creates what is missing and keeps the rest, as
``syncjobs migrate`` does; on a database 0001 created just now, it changes nothing.
"""

from __future__ import annotations

from django.db import migrations

from syncjobs.contrib.django.ddl import run_ddl


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0001_initial")]

    operations = [
        migrations.RunPython(run_ddl, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
