"""A real Django project for syncjobs' integration tests: SQLite, PostgreSQL and MariaDB at once.

Each server is one alias ("default" is SQLite); the tests point
``SYNCJOBS["DATABASE"]`` at each in turn. A server that does not answer is
left out (its tests skip, or fail under CI=true).
"""

from __future__ import annotations

import os
import tempfile
from urllib.parse import unquote, urlsplit

import pymysql

from syncjobs.database.dialects import Connector

# Django's MySQL backend wants mysqlclient, which needs C headers to build;
# PyMySQL stands in for it here (syncjobs' own connections use PyMySQL anyway).
pymysql.version_info = (2, 2, 1, "final", 0)
pymysql.install_as_MySQLdb()

SERVERS = {
    "postgresql": os.environ.get("SYNCJOBS_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
    "mysql": os.environ.get("SYNCJOBS_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test"),
}


def _answers(url: str) -> bool:
    try:
        Connector(url).connect().close()
    except Exception:  # noqa: BLE001 - any failure: the server is not there
        return False
    return True


_folder = tempfile.mkdtemp(prefix="syncjobs-django-")
DATABASES: dict[str, dict[str, object]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_folder, "db.sqlite3"),
        # A file, not memory: syncjobs' worker connections must see it too.
        "TEST": {"NAME": os.path.join(_folder, "test.sqlite3")},
    },
}


def _server(url: str, engine: str, **test: str) -> dict[str, object]:
    """The Django database for a server URL; its test database is named after the URL's, so that
    runs pointed at different databases (SYNCJOBS_TEST_*) never share one."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/") or "test"
    return {
        "ENGINE": engine,
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": parts.port or "",
        "TEST": {"NAME": f"{name}_syncjobs_django", **test},
    }


if _answers(SERVERS["postgresql"]):
    DATABASES["postgresql"] = _server(SERVERS["postgresql"], "django.db.backends.postgresql")
if _answers(SERVERS["mysql"]):
    DATABASES["mysql"] = _server(SERVERS["mysql"], "django.db.backends.mysql", CHARSET="utf8mb4")

SECRET_KEY = "syncjobs-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
USE_TZ = True
ROOT_URLCONF = "tests.django_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "syncjobs.contrib.django",
    "tests.django_project.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
SYNCJOBS = {"DATABASE": "default", "WORKERS": 2, "SHUTDOWN_GRACE": 1.0}
TASKS = {
    "default": {"BACKEND": "syncjobs.contrib.django.tasks.SyncJobsBackend", "QUEUES": ["default", "reports"]},
    # Tasks declared for another backend, sent to syncjobs with using(backend="default").
    "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
}
