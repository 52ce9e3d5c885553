"""``settings.SYNCJOBS``: read when first used (never at import), checked, and turned into queues."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections

KNOWN_KEYS = ("BACKEND", "URL", "DATABASE", "WORKERS", "QUEUES", "SHUTDOWN_GRACE")
BACKENDS = ("memory", "database")
#: The jobs table the app's migration creates.
TABLE = "syncjobs_jobs"


@dataclasses.dataclass(frozen=True)
class Config:
    backend: str
    #: A database of syncjobs' own, by URL...
    url: str | None
    #: ...or a Django database alias: dispatch joins its transactions.
    database: str | None
    workers: int
    queues: tuple[str, ...]
    shutdown_grace: float

    @property
    def default_queue(self) -> str:
        return self.queues[0]

    @property
    def results_database(self) -> str:
        """Where the Tasks backend keeps its results."""
        return self.database or DEFAULT_DB_ALIAS


def read() -> Config:
    raw = getattr(settings, "SYNCJOBS", {})
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"settings.SYNCJOBS must be a dict, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(KNOWN_KEYS))
    if unknown:
        raise ImproperlyConfigured(
            f"settings.SYNCJOBS has unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(KNOWN_KEYS)}"
        )
    url, database = raw.get("URL"), raw.get("DATABASE")
    if url and database:
        raise ImproperlyConfigured(
            "settings.SYNCJOBS: give URL (a database of its own) or DATABASE (an alias), not both"
        )
    backend = raw.get("BACKEND", "database" if url or database else "memory")
    if backend not in BACKENDS:
        raise ImproperlyConfigured(f"settings.SYNCJOBS BACKEND must be one of {BACKENDS}, got {backend!r}")
    if backend == "database" and not (url or database):
        raise ImproperlyConfigured('settings.SYNCJOBS: the database backend needs "URL" or "DATABASE"')
    if backend == "memory" and (url or database):
        raise ImproperlyConfigured('settings.SYNCJOBS: the memory backend takes no "URL" or "DATABASE"')
    if database is not None and database not in settings.DATABASES:
        raise ImproperlyConfigured(f"settings.SYNCJOBS DATABASE {database!r} is not in settings.DATABASES")
    workers = raw.get("WORKERS", 4)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ImproperlyConfigured(f"settings.SYNCJOBS WORKERS must be an int >= 1, got {workers!r}")
    queues = raw.get("QUEUES", ["default"])
    if isinstance(queues, str) or not queues or not all(isinstance(q, str) and q for q in queues):
        raise ImproperlyConfigured(f"settings.SYNCJOBS QUEUES must be a non-empty list of names, got {queues!r}")
    grace = raw.get("SHUTDOWN_GRACE", 5.0)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace < math.inf:
        raise ImproperlyConfigured(f"settings.SYNCJOBS SHUTDOWN_GRACE must be seconds >= 0, got {grace!r}")
    return Config(backend, url, database, workers, tuple(queues), float(grace))


def url_for(alias: str) -> str:
    """A syncjobs URL for the database Django knows as ``alias`` (its test database, under tests)."""
    params: dict[str, Any] = connections[alias].settings_dict
    engine, name = params["ENGINE"], str(params.get("NAME") or "")
    if engine.endswith("sqlite3"):
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ImproperlyConfigured(
                f"Django database {alias!r} is an in-memory SQLite database, which syncjobs' own connections "
                'cannot share: give it a file NAME (and, for tests, a file TEST["NAME"])'
            )
        return f"sqlite:///{os.path.abspath(name)}"
    if "postgresql" in engine:
        scheme, port = "postgresql", params.get("PORT") or 5432
    elif "mysql" in engine:
        scheme, port = "mysql", params.get("PORT") or 3306
    else:
        raise ImproperlyConfigured(f"syncjobs cannot use Django database {alias!r}: {engine} is not supported")
    user = quote(str(params.get("USER") or ""), safe="")
    password = params.get("PASSWORD")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = params.get("HOST") or ("localhost" if scheme == "mysql" else "")
    return f"{scheme}://{auth}{host}:{port}/{quote(name, safe='')}" if host else f"{scheme}://{auth}/{quote(name)}"
