from __future__ import annotations

from django.apps import AppConfig


class SyncJobsConfig(AppConfig):
    name = "syncjobs.contrib.django"
    label = "syncjobs"
    verbose_name = "Background jobs"
    default_auto_field = "django.db.models.BigAutoField"
