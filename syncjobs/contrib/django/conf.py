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
from django.db.backends.base.base import BaseDatabaseWrapper

from ...job import check_keep_result, check_timeout
from ...status import DEFAULT_KEEP_RESULT
from ...worker import DEFAULT_UNKNOWN_JOB_WAIT

KNOWN_KEYS = (
    "BACKEND",
    "URL",
    "DATABASE",
    "WORKERS",
    "QUEUES",
    "SHUTDOWN_GRACE",
    "TIMEOUT",
    "KEEP_RESULT",
    "UNKNOWN_JOB_WAIT",
)
BACKENDS = ("memory", "database")
#: The jobs table the app's migration creates.
TABLE = "syncjobs_jobs"


@dataclasses.dataclass(frozen=True)
class Config:
    backend: str
    #: A database of syncjobs' own, by URL (its password kept out of repr())...
    url: str | None = dataclasses.field(repr=False)
    #: ...or a Django database alias: dispatch joins its transactions.
    database: str | None
    workers: int
    queues: tuple[str, ...]
    shutdown_grace: float
    #: Seconds a run of a job without a TIMEOUT of its own may take; None: no limit.
    timeout: float | None = None
    #: Seconds a finished job's record is kept, for jobs without a KEEP_RESULT of their own.
    keep_result: float = DEFAULT_KEEP_RESULT
    #: Seconds a job of a NAME no class is registered for waits for a worker that knows it, from first met.
    unknown_job_wait: float = DEFAULT_UNKNOWN_JOB_WAIT

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
    try:
        timeout = check_timeout(raw.get("TIMEOUT"), "settings.SYNCJOBS TIMEOUT")
        keep = check_keep_result(raw.get("KEEP_RESULT", DEFAULT_KEEP_RESULT), "settings.SYNCJOBS KEEP_RESULT")
        unknown_wait = check_keep_result(
            raw.get("UNKNOWN_JOB_WAIT", DEFAULT_UNKNOWN_JOB_WAIT), "settings.SYNCJOBS UNKNOWN_JOB_WAIT"
        )
    except TypeError as exc:
        raise ImproperlyConfigured(str(exc)) from None
    return Config(backend, url, database, workers, tuple(queues), float(grace), timeout, keep, unknown_wait)


def connection_for(alias: str) -> tuple[str, dict[str, Any]]:
    """How syncjobs connects to the database Django knows as ``alias`` (its test database, under tests)."""
    return connection_params(connections[alias])


def connection_params(connection: BaseDatabaseWrapper) -> tuple[str, dict[str, Any]]:
    """A URL (the dialect, and what the worker prints) and the driver's keyword arguments for ``connection``.

    The arguments are the ones Django connects with (``get_connection_params()``:
    a Unix socket or an IPv6 ``HOST``, ``OPTIONS`` such as ``sslmode``), less
    what is Django's own Python side (its cursor class, adapters and converters).
    """
    params: dict[str, Any] = connection.settings_dict
    engine, name = params["ENGINE"], str(params.get("NAME") or "")
    if connection.vendor == "sqlite":
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ImproperlyConfigured(
                f"Django database {connection.alias!r} is an in-memory SQLite database, which syncjobs' own "
                'connections cannot share: give it a file NAME (and, for tests, a file TEST["NAME"])'
            )
        return f"sqlite:///{os.path.abspath(name)}", {}
    if connection.vendor not in _DJANGO_ONLY:
        raise ImproperlyConfigured(
            f"syncjobs cannot use Django database {connection.alias!r}: {engine} is not supported"
        )
    django_only = _DJANGO_ONLY[connection.vendor]
    args = {key: value for key, value in connection.get_connection_params().items() if key not in django_only}
    host = str(params.get("HOST") or "")
    # What the worker prints, and what names the dialect: the arguments
    # override all it says (only they hold the password). libpq parses it
    # before applying them, so it stays a valid URL for every HOST.
    shown_host = f"[{host}]" if ":" in host else quote(host, safe="")
    port = f":{params['PORT']}" if params.get("PORT") else ""
    user = quote(str(params.get("USER") or ""), safe="")
    return f"{connection.vendor}://{user}{'@' if user else ''}{shown_host}{port}/{quote(name, safe='')}", args


#: What ``get_connection_params()`` holds for Django's own use, by vendor:
#: PostgreSQL's cursor class and type adapters; MySQL's converters, and the
#: flag that makes UPDATE count matched rows instead of changed ones.
_DJANGO_ONLY = {
    "postgresql": frozenset({"cursor_factory", "context"}),
    "mysql": frozenset({"conv", "client_flag"}),
}
