"""Schema version 10: ``traceback`` on ``syncjobs_jobs``, where a dead job's last run raised.

As 0002 and 0004: syncjobs' own DDL again, which adds what is missing and keeps the rest.
"""

from __future__ import annotations

from django.db import migrations

from syncjobs.contrib.django.ddl import run_ddl


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0010_limits")]

    operations = [
        # Not reversed: the column is harmless to the older version, which never reads it.
        migrations.RunPython(run_ddl, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
