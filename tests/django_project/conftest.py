"""Django's own test machinery (pytest-django) around a real project: ``tox -e django``.

tests/conftest.py leaves this folder out unless Django 6, pytest-django and
DJANGO_SETTINGS_MODULE=tests.django_project.settings are all there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings

import syncjobs.contrib.django as sj
from tests.conftest import SERVER_URLS

ALIASES = ["default", "postgresql", "mysql"]


@pytest.fixture(params=ALIASES)
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each database in turn, with settings.SYNCJOBS pointing at it."""
    name: str = request.param
    if name not in settings.DATABASES:
        reason = f"{name} is not reachable at {SERVER_URLS[name]}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI must start it: see .ci/run)")
        pytest.skip(reason)
    with override_settings(SYNCJOBS={"DATABASE": name, "WORKERS": 2, "SHUTDOWN_GRACE": 1.0}):
        yield name


@pytest.fixture(autouse=True)
def _stop_queues(django_db_blocker: Any) -> Iterator[None]:
    yield
    sj.reset()
    with django_db_blocker.unblock():
        for name in settings.DATABASES:
            with connections[name].cursor() as cursor:  # unmanaged: a flush leaves it alone
                cursor.execute("DELETE FROM syncjobs_jobs")


@pytest.fixture(scope="session", autouse=True)
def _listeners_gone_before_the_test_databases(django_db_setup: Any) -> Iterator[None]:
    """PostgreSQL drops a test database only once no session uses it: let LISTEN threads leave first."""
    yield
    sj.reset()
    for thread in threading.enumerate():
        if thread.name == "syncjobs-listener":
            thread.join(timeout=10)
