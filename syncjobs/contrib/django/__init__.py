"""syncjobs for Django: add ``"syncjobs.contrib.django"`` to ``INSTALLED_APPS``.

Configuration is ``settings.SYNCJOBS`` (see ``conf.py``), read when a queue is
first needed, never at import. Job classes register with :func:`register`
(a class decorator, usable at import); :func:`dispatch` joins the caller's
transaction where it can and waits for its commit where it cannot.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections, transaction

from ...database import DatabaseJobQueue
from ...job import Job
from ...memory import InMemoryJobQueue
from ...queue import Delay, StoreQueue
from . import conf

J = TypeVar("J", bound=type[Job])

_lock = threading.RLock()
_job_classes: list[type[Job]] = []
_queues: dict[str, StoreQueue] = {}
_started_in: dict[int, int] = {}  # id(queue) -> the pid whose workers run it (memory backend)
_pid = os.getpid()  # whose _queues these are


def register(job_cls: J) -> J:
    """Make ``job_cls`` runnable by the project's queues; a class decorator, fine at import time."""
    with _lock:
        if job_cls not in _job_classes:
            _job_classes.append(job_cls)
        for queue in _queues.values():
            queue.register(job_cls)
    return job_cls


def get_queue(name: str | None = None) -> StoreQueue:
    """The queue called ``name`` (default: the first of ``QUEUES``), built on first use."""
    with _lock:
        _forget_parent()
        config = conf.read()
        name = name or config.default_queue
        queue = _queues.get(name)
        if queue is None:
            queue = _queues[name] = _build(config, name)
        return queue


def worker_queues(
    names: list[str] | None = None, *, workers: int | None = None, grace: float | None = None
) -> list[StoreQueue]:
    """Fresh queues for a worker process (``syncjobs_worker``), one per name, sharing the jobs."""
    config = conf.read()
    if config.backend == "memory":
        raise ImproperlyConfigured(
            "settings.SYNCJOBS uses the memory backend: its jobs run inside the web process that dispatches "
            'them, so there is nothing for a worker process to take; use "DATABASE" or "URL"'
        )
    base = get_queue()
    if not isinstance(base, DatabaseJobQueue):  # the backend checks above make this impossible
        raise TypeError(f"expected a database queue, got {type(base).__name__}")
    return [
        base.for_queue(name, workers=workers or config.workers, shutdown_grace=grace)
        for name in dict.fromkeys(names or config.queues)
    ]


def dispatch(job: Job, *, delay: Delay = None, queue: str | None = None, using: str | None = None) -> str:
    """Enqueue ``job``; returns its id.

    With ``"DATABASE"`` set and a transaction open on that database, the job
    is inserted in it: rolled back with it, visible to workers at its commit.
    Otherwise (the memory backend, a ``"URL"`` of its own), the job is checked
    now and handed over when the transaction of ``using`` (default: the
    default database) commits, or at once outside a transaction.
    """
    target = get_queue(queue)
    config = conf.read()
    if config.database is not None and isinstance(target, DatabaseJobQueue) and using in (None, config.database):
        connection = connections[config.database]
        if connection.in_atomic_block:
            connection.ensure_connection()
            return target.dispatch(job, delay=delay, connection=connection.connection)
        return target.dispatch(job, delay=delay)
    prepared = target.prepare(job, delay=delay)
    _ensure_embedded(config, target)  # first: a dispatch whose start fails hands over no job
    transaction.on_commit(prepared.submit, using=using or DEFAULT_DB_ALIAS)
    return prepared.id


def reset() -> None:
    """Shut down and forget the queues (settings changed, or a test is done)."""
    with _lock:
        queues = list(_queues.values())
        _queues.clear()
        _started_in.clear()
    for queue in queues:
        queue.shutdown(grace=0)


def _forget_parent() -> None:
    """In a forked child (a pre-forking server), the parent's queues, connections and threads are not ours."""
    global _pid  # noqa: PLW0603 - the one process-wide fact
    if _pid != os.getpid():
        _pid = os.getpid()
        _queues.clear()
        _started_in.clear()


def _build(config: conf.Config, name: str) -> StoreQueue:
    queue: StoreQueue
    if config.backend == "memory":
        queue = InMemoryJobQueue(config.workers, shutdown_grace=config.shutdown_grace)
    else:
        url = config.url or conf.url_for(config.database or DEFAULT_DB_ALIAS)
        # With DATABASE, the table is the app's migration's: never created behind it.
        queue = DatabaseJobQueue(
            url,
            workers=config.workers,
            queue=name,
            shutdown_grace=config.shutdown_grace,
            table=conf.TABLE,
            auto_schema=config.database is None,
        )
    from .tasks import RunTask  # noqa: PLC0415 - tasks.py imports this module

    for job_cls in (*_job_classes, RunTask):
        queue.register(job_cls)
    queue.wrap_runs(django_connections)
    return queue


def _ensure_embedded(config: conf.Config, queue: StoreQueue) -> None:
    """The memory backend runs its jobs in this process: start its workers here, once per process."""
    if config.backend != "memory":
        return
    with _lock:
        if _started_in.get(id(queue)) == os.getpid():
            return
        _started_in[id(queue)] = os.getpid()
    try:
        queue.start()
    except BaseException:
        with _lock:  # the next dispatch tries again
            _started_in.pop(id(queue), None)
        raise


@contextlib.contextmanager
def django_connections() -> Iterator[None]:
    """Around each run, what Django does around each request: drop stale or broken connections."""
    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()


def _settings_changed(*, setting: str, **_: object) -> None:
    if setting == "SYNCJOBS":
        reset()


setting_changed.connect(_settings_changed)
