"""PostgreSQL: the jobs table is vacuumed after 1,000 dead tuples and 1% of its rows.

Running syncjobs' DDL again, as ``syncjobs migrate`` does, sets the table's
autovacuum thresholds and creates nothing new; on SQLite and MySQL it changes
nothing. The schema version stays 3: nothing depends on the setting.
"""

from __future__ import annotations

from django.db import migrations

from syncjobs.contrib.django.ddl import run_ddl


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0002_finished_ids")]

    operations = [
        migrations.RunPython(run_ddl, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
