from __future__ import annotations

from importlib import import_module
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

#: The module of each installed app imported when Django starts, for the jobs it defines; and, where
#: syncjobs runs Django's Tasks, the tasks module (elsewhere a tasks.py may well be another queue's).
JOBS_MODULE, TASKS_MODULE = "jobs", "tasks"
TASKS_BACKEND = "syncjobs.contrib.django.tasks.SyncJobsBackend"


class SyncJobsConfig(AppConfig):
    name = "syncjobs.contrib.django"
    label = "syncjobs"
    verbose_name = "Background jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django registers the check of its task backends (ours warns of a queue
        # no worker serves: syncjobs.W001) only once django.tasks is imported,
        # which `manage.py check` does not do by itself.
        import django.tasks  # noqa: F401, PLC0415

        checks.register(check_settings)
        discover_jobs(exclude=self)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``settings.SYNCJOBS`` as ``manage.py check`` sees it: each mistake an Error naming the key."""
    from . import conf  # noqa: PLC0415 - it reads settings, which only a check should do here

    try:
        conf.read()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint='What each key takes is in "Using with Django" in syncjobs\' README.',
                id="syncjobs.E002",
            )
        ]
    return []


def discover_jobs(*, exclude: AppConfig | None = None) -> None:
    """Import every installed app's ``jobs`` module, and its ``tasks`` one where syncjobs runs Django's Tasks.

    As the admin finds ``admin.py``: so a job class or task is registered in
    every process, a worker started with ``--skip-checks`` too, not only where
    a view happens to import it. An app without such a module is skipped; an
    error inside one is raised, as importing it would.
    """
    backends = getattr(settings, "TASKS", {})
    runs_tasks = isinstance(backends, dict) and any(
        isinstance(backend, dict) and backend.get("BACKEND") == TASKS_BACKEND for backend in backends.values()
    )
    names = (JOBS_MODULE, TASKS_MODULE) if runs_tasks else (JOBS_MODULE,)
    for app in apps.get_app_configs():
        if app is exclude:
            continue
        for name in names:
            if module_has_submodule(app.module, name):
                import_module(f"{app.name}.{name}")
