"""Queues built from a settings mapping or a URL, as an app's configuration names them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .database import DatabaseJobQueue
from .database.dialects import MYSQL, POSTGRES, SQLITE, dialect_for
from .errors import QueueError
from .memory import InMemoryJobQueue
from .protocols import JobQueue
from .queue import DEFAULT_SHUTDOWN_GRACE
from .status import DEFAULT_KEEP_RESULT
from .urls import mask_url

logger = logging.getLogger("syncjobs")

KNOWN_KEYS = frozenset({"backend", "url", "concurrency", "shutdown_grace", "timeout", "keep_result"})
DATABASE_BACKENDS = {"sqlite": SQLITE, "postgresql": POSTGRES, "mysql": MYSQL}
AVAILABLE_BACKENDS = ("memory", *DATABASE_BACKENDS)
DEFAULT_CONCURRENCY = 4


def from_settings(settings: Mapping[str, Any]) -> JobQueue:
    """A queue from ``{"backend", "url", "concurrency", "shutdown_grace", "timeout", "keep_result"}``.

    Unknown keys are refused.
    """
    _check_keys(settings)
    backend = settings.get("backend", "memory")
    url = settings.get("url")
    if backend == "memory":
        if url not in (None, "", "memory://"):
            raise QueueError(f"the memory backend takes no url (or 'memory://'), got {_shown(url)}")
        return _memory_queue(settings)
    if backend not in DATABASE_BACKENDS:
        raise QueueError(
            f"unknown backend {backend!r} in settings: choose one of {', '.join(map(repr, AVAILABLE_BACKENDS))}"
        )
    if not url:
        raise QueueError(f"the {backend} backend needs a 'url' in settings")
    if dialect_for(url) is not DATABASE_BACKENDS[backend]:
        raise QueueError(f"settings name the {backend!r} backend but the url {_shown(url)} is for another database")
    return _database_queue(url, settings)


def inmemory_from_settings(settings: Mapping[str, Any]) -> InMemoryJobQueue:
    """Always an in-memory queue (for tests and dev), whatever backend the settings name."""
    _check_keys(settings)
    backend = settings.get("backend", "memory")
    if backend != "memory":
        logger.warning("settings name the %r backend; using an in-memory queue instead", backend)
    return _memory_queue(settings)


def connect(url: str, **options: Any) -> JobQueue:
    """A queue for ``url``: ``memory://``, ``sqlite:///path``, ``postgresql://…`` or ``mysql://…``.

    ``options`` go to the queue's constructor (``workers``, ``shutdown_grace`` …).
    """
    scheme = urlsplit(url).scheme if isinstance(url, str) else None
    if scheme == "memory":
        return InMemoryJobQueue(**options)
    dialect_for(url)  # a clear QueueError for an unknown scheme
    return DatabaseJobQueue(url, **options)


def _shown(url: object) -> str:
    return repr(mask_url(url)) if isinstance(url, str) else f"of type {type(url).__name__}"


def _check_keys(settings: Mapping[str, Any]) -> None:
    if not isinstance(settings, Mapping):
        raise QueueError(f"settings must be a mapping, got {type(settings).__name__}")
    unknown = sorted(set(settings) - KNOWN_KEYS)
    if unknown:
        raise QueueError(
            f"unknown settings key(s) {', '.join(map(repr, unknown))}; known keys: {', '.join(sorted(KNOWN_KEYS))}"
        )


def _database_queue(url: str, settings: Mapping[str, Any]) -> DatabaseJobQueue:
    concurrency = settings.get("concurrency")
    grace = settings.get("shutdown_grace")
    try:
        return DatabaseJobQueue(
            url,
            workers=DEFAULT_CONCURRENCY if concurrency is None else concurrency,
            shutdown_grace=DEFAULT_SHUTDOWN_GRACE if grace is None else grace,
            timeout=settings.get("timeout"),
            keep_result=settings.get("keep_result", DEFAULT_KEEP_RESULT),
        )
    except ValueError as exc:
        raise QueueError(f"bad settings: {exc}") from exc


def _memory_queue(settings: Mapping[str, Any]) -> InMemoryJobQueue:
    concurrency = settings.get("concurrency")
    grace = settings.get("shutdown_grace")
    try:
        return InMemoryJobQueue(
            DEFAULT_CONCURRENCY if concurrency is None else concurrency,
            shutdown_grace=DEFAULT_SHUTDOWN_GRACE if grace is None else grace,
            timeout=settings.get("timeout"),
            keep_result=settings.get("keep_result", DEFAULT_KEEP_RESULT),
        )
    except ValueError as exc:
        raise QueueError(f"bad settings: {exc}") from exc
