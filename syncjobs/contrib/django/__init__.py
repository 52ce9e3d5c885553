"""syncjobs for Django: add ``"syncjobs.contrib.django"`` to ``INSTALLED_APPS``.

Configuration is ``settings.SYNCJOBS`` (see ``conf.py``), read when a queue is
first needed, never at import. Job classes register with :func:`register`,
dead-letter callbacks with :func:`on_dead_letter` (both decorators, usable at
import): every queue gets them, in every process. :func:`dispatch` joins the
caller's transaction where it can and waits for its commit where it cannot.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections, transaction
from typing_extensions import Unpack

from ...database import DatabaseJobQueue
from ...dead_letters import DeadLetterCallback
from ...function_tasks import FunctionJob, TaskDecorator
from ...hooks import DispatchHook
from ...job import Job
from ...memory import InMemoryJobQueue
from ...protocols import Delay
from ...queue import StoreQueue
from ...scheduler import JobMaker
from ...schedules import Schedule, When
from ...status import JobHandle
from ...worker import RunObserver, RunWrapper
from ..integration import JobSetup, ProcessQueues
from . import conf

J = TypeVar("J", bound=type[Job])
C = TypeVar("C", bound=DeadLetterCallback)
H = TypeVar("H", bound=DispatchHook)
R = TypeVar("R", bound=RunObserver)

_setup = JobSetup()


def register(job_cls: J) -> J:
    """Make ``job_cls`` runnable by the project's queues; a class decorator, fine at import time."""
    _setup.register(job_cls)
    return job_cls


def on_dead_letter(callback: C) -> C:
    """Call ``callback(dead_letter)`` for each job of the project's queues that will not run again.

    A decorator, fine at import time; it reaches every queue, in every
    process (``syncjobs_worker`` too), between the connection housekeeping
    jobs get.
    """
    _setup.on_dead_letter(callback)
    return callback


def wrap_runs(wrapper: RunWrapper) -> None:
    """Enter ``wrapper()`` (a context manager) around every run of the project's queues."""
    _setup.wrap_runs(wrapper)


def around_dispatch(hook: H) -> H:
    """Enter ``hook(job)`` (a context manager) around every dispatch to the project's queues; a decorator.

    See ``StoreQueue.around_dispatch``: a context variable it sets travels
    with the job, and raising ``QueueError`` refuses the dispatch.
    """
    _setup.around_dispatch(hook)
    return hook


def observe_runs(observer: R) -> R:
    """Call ``observer(report)`` after every run of the project's queues (a ``RunReport``); a decorator.

    On the worker's thread, between the connection housekeeping jobs get;
    one that raises is logged and changes nothing.
    """
    _setup.observe_runs(observer)
    return observer


def get_queue(name: str | None = None) -> StoreQueue:
    """The queue called ``name`` (default: the first of ``QUEUES``), built on first use in each process."""
    return _queues.get(name or conf.read().default_queue)


def worker_queues(
    names: list[str] | None = None,
    *,
    workers: int | None = None,
    grace: float | None = None,
    timeout: float | None = None,
    keep_result: float | None = None,
) -> list[StoreQueue]:
    """Fresh queues for a worker process (``syncjobs_worker``), one per name; what is not None overrides SYNCJOBS."""
    config = conf.read()
    if config.backend == "memory":
        raise ImproperlyConfigured(
            "settings.SYNCJOBS uses the memory backend: its jobs run inside the web process that dispatches "
            'them, so there is nothing for a worker process to take; use "DATABASE" or "URL"'
        )
    return [
        _build(config, name, workers=workers or config.workers, grace=grace, timeout=timeout, keep_result=keep_result)
        for name in dict.fromkeys(names or config.queues)
    ]


def dispatch(
    job: Job,
    *,
    delay: Delay = None,
    run_at: datetime.datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
    using: str | None = None,
) -> JobHandle:
    """Enqueue ``job``; returns its handle (its id, with ``status()`` and ``result()``).

    With ``"DATABASE"`` set and a transaction open on that database, the job
    is inserted in it: rolled back with it, visible to workers at its commit.
    Otherwise (the memory backend, a ``"URL"`` of its own), the job is checked
    now and handed over when the transaction of ``using`` (default: the
    default database) commits, or at once outside a transaction.
    """
    config = conf.read()
    name = queue or config.default_queue
    target = _queues.get(name)
    if config.database is not None and isinstance(target, DatabaseJobQueue) and using in (None, config.database):
        connection = connections[config.database]
        if connection.in_atomic_block:
            connection.ensure_connection()
            return target.dispatch(job, delay=delay, run_at=run_at, priority=priority, connection=connection.connection)
        return target.dispatch(job, delay=delay, run_at=run_at, priority=priority)
    prepared = target.prepare(job, delay=delay, run_at=run_at, priority=priority)
    if config.backend == "memory":
        # Its jobs run in this process: start its workers first, so that a
        # dispatch whose start fails hands over no job.
        _queues.start([name])
    # At the commit a unique job may find its key held: then nothing is enqueued, and (logged)
    # the handle returned here names a job that never exists.
    transaction.on_commit(
        lambda: target.handle_of(prepared.name, prepared.id, prepared.submit()), using=using or DEFAULT_DB_ALIAS
    )
    return target.handle(prepared.id)


def schedule(name: str, job: Job | JobMaker, *, queue: str | None = None, **when: Unpack[When]) -> None:
    """Dispatch ``job`` (or ``job(slot)``) at each slot, on ``queue`` (default: the first of ``QUEUES``).

    Fine at import time, like :func:`register`: every process that runs the
    queue's workers (``syncjobs_worker``) dispatches its slots, one job per
    slot in all. ``when``: as ``StoreQueue.schedule`` takes it.
    """
    _setup.schedule(name, Schedule(**when), job, queue)


def _schedule_task(name: str, schedule: Schedule, job_class: type[FunctionJob], options: Mapping[str, Any]) -> None:
    _setup.schedule(name, schedule, lambda slot: job_class([], {}), options.get("queue"))


#: ``@task`` (or ``@task(name=…, max_attempts=…, retry_wait=…, queue=…, schedule=…)``) on a module-level
#: function: ``f.dispatch(…)`` enqueues a call as :func:`dispatch` does, in the caller's transaction where
#: it can; ``f.using(delay=…, queue=…, using=…)`` sets options first. Fine at import time, like :func:`register`.
task = TaskDecorator(
    register,
    dispatch,
    frozenset({"delay", "run_at", "priority", "queue", "using"}),
    frozenset({"queue"}),
    schedule=_schedule_task,
)


def reset() -> None:
    """Shut down and forget the queues (settings changed, or a test is done)."""
    for queue in _queues.forget():
        queue.shutdown(grace=0)


def _build(
    config: conf.Config,
    name: str,
    *,
    workers: int | None = None,
    grace: float | None = None,
    timeout: float | None = None,
    keep_result: float | None = None,
) -> StoreQueue:
    queue: StoreQueue
    workers = config.workers if workers is None else workers
    grace = config.shutdown_grace if grace is None else grace
    timeout = config.timeout if timeout is None else timeout
    keep_result = config.keep_result if keep_result is None else keep_result
    if config.backend == "memory":
        queue = InMemoryJobQueue(workers, shutdown_grace=grace, timeout=timeout, keep_result=keep_result)
    else:
        url, connect_args = (config.url, {}) if config.url else conf.connection_for(config.database or DEFAULT_DB_ALIAS)
        # With DATABASE, the table is the app's migration's: never created behind it.
        queue = DatabaseJobQueue(
            url,
            connect_args=connect_args,
            workers=workers,
            queue=name,
            shutdown_grace=grace,
            timeout=timeout,
            keep_result=keep_result,
            unknown_job_wait=config.unknown_job_wait,
            table=conf.TABLE,
            auto_schema=config.database is None,
        )
    from .tasks import RunTask, find_task_job  # noqa: PLC0415 - tasks.py imports this module

    queue.register(RunTask)  # the jobs an earlier syncjobs queued for Django tasks
    queue.find_job_classes_with(find_task_job)  # a task the worker has not imported yet
    return _setup.apply(queue, around=django_connections, name=name, default=config.default_queue)


_queues = ProcessQueues(lambda name: _build(conf.read(), name))


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
