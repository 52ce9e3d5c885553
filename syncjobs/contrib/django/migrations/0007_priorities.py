"""Schema version 6: ``priority`` on ``syncjobs_jobs``, and the claim's index by priority.

As 0002 and 0004: syncjobs' own DDL again, which adds what is missing and
keeps the rest; then the admin's unmanaged model learns the column.
"""

from __future__ import annotations

from django.db import migrations, models

from syncjobs.contrib.django.ddl import run_ddl


class Migration(migrations.Migration):
    dependencies = [("syncjobs", "0006_finished_payloads")]

    operations = [
        migrations.RunPython(run_ddl, migrations.RunPython.noop, atomic=False, elidable=False),
        migrations.AddField(model_name="queuedjob", name="priority", field=models.IntegerField(default=0)),
    ]
