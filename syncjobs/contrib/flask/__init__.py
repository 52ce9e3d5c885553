"""syncjobs for Flask: ``SyncJobs(app)``, or ``init_app(app)`` for app factories.

Config keys: ``SYNCJOBS_URL`` (default ``memory://``), ``SYNCJOBS_WORKERS``
(4), ``SYNCJOBS_QUEUES`` (``["default"]``), ``SYNCJOBS_GRACE`` (5 seconds),
``SYNCJOBS_EMBEDDED`` (False), ``SYNCJOBS_TIMEOUT`` (None: no limit on a run),
``SYNCJOBS_KEEP_RESULT`` (600: seconds a finished job's record is kept). Each
app's state is ``app.extensions["syncjobs"]``; jobs run inside an app context of the app
that dispatched them. ``flask syncjobs worker`` runs the workers.

Job classes, run wrappers and dead-letter callbacks belong to the extension
(``register``, ``wrap_runs``, ``on_dead_letter``): every queue any app builds,
in any process, gets them.

Embedded mode (``SYNCJOBS_EMBEDDED = True``, and always with ``memory://``)
runs the worker threads inside the web process: started lazily, on the first
request or dispatch in each process (so a pre-forking server such as gunicorn
forks before any thread exists), and stopped with the grace at exit.
"""

from __future__ import annotations

import datetime
from typing import Any, TypeVar

from flask import Flask, current_app

from ...dead_letters import DeadLetterCallback
from ...function_tasks import TaskDecorator
from ...job import Job
from ...protocols import Delay
from ...queue import DEFAULT_SHUTDOWN_GRACE, StoreQueue
from ...settings import connect
from ...status import DEFAULT_KEEP_RESULT, JobHandle
from ...worker import RunWrapper
from ..integration import JobSetup, ProcessQueues

J = TypeVar("J", bound=type[Job])
C = TypeVar("C", bound=DeadLetterCallback)

_DISPATCH_OPTIONS = frozenset({"delay", "run_at", "queue"})

DEFAULTS: dict[str, Any] = {
    "SYNCJOBS_URL": "memory://",
    "SYNCJOBS_WORKERS": 4,
    "SYNCJOBS_QUEUES": ["default"],
    "SYNCJOBS_GRACE": DEFAULT_SHUTDOWN_GRACE,
    "SYNCJOBS_EMBEDDED": False,
    "SYNCJOBS_TIMEOUT": None,
    "SYNCJOBS_KEEP_RESULT": DEFAULT_KEEP_RESULT,
}


class SyncJobs:
    """The extension: one object for any number of apps."""

    def __init__(self, app: Flask | None = None) -> None:
        self._setup = JobSetup()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        for key, value in DEFAULTS.items():
            app.config.setdefault(key, value)
        state = AppQueues(app, self._setup)
        app.extensions["syncjobs"] = state
        app.before_request(state.ensure_embedded)
        from .cli import syncjobs_group  # noqa: PLC0415 - click is loaded only with an app

        app.cli.add_command(syncjobs_group)

    def register(self, job_cls: J) -> J:
        """Make ``job_cls`` runnable by every app's queues; a class decorator."""
        self._setup.register(job_cls)
        return job_cls

    def on_dead_letter(self, callback: C) -> C:
        """Call ``callback(dead_letter)`` for each job of any app's queues that will not run again; a decorator.

        It runs in the worker thread, inside an app context of the queue's app.
        """
        self._setup.on_dead_letter(callback)
        return callback

    def wrap_runs(self, wrapper: RunWrapper) -> None:
        """Enter ``wrapper()`` (a context manager) around every run, inside the app context."""
        self._setup.wrap_runs(wrapper)

    @property
    def task(self) -> TaskDecorator:
        """``@jobs.task`` (or ``@jobs.task(name=…, max_attempts=…, retry_wait=…, queue=…)``) on a module-level function.

        ``f.dispatch(…)`` enqueues a call on the current app's queue, as
        :meth:`dispatch` does; ``f.using(delay=…, queue=…)`` sets options first.
        """
        return TaskDecorator(self.register, self.dispatch, _DISPATCH_OPTIONS, frozenset({"queue"}))

    def dispatch(
        self, job: Job, *, delay: Delay = None, run_at: datetime.datetime | None = None, queue: str | None = None
    ) -> JobHandle:
        """Enqueue ``job`` on the current app's queue (it runs inside that app's context); returns its handle."""
        state: AppQueues = current_app.extensions["syncjobs"]
        return state.dispatch(job, delay=delay, run_at=run_at, queue=queue)


class AppQueues:
    """One app's queues, built on first use in each process."""

    def __init__(self, app: Flask, setup: JobSetup) -> None:
        self.app = app
        self._setup = setup
        self._queues = ProcessQueues(lambda name: self._build(name, self.app.config["SYNCJOBS_WORKERS"]))
        #: False in a process that ``flask syncjobs worker`` runs: it has its workers.
        self.embedded_allowed = True

    @property
    def url(self) -> str:
        return str(self.app.config["SYNCJOBS_URL"])

    @property
    def embedded(self) -> bool:
        configured = bool(self.app.config["SYNCJOBS_EMBEDDED"]) or self.url.startswith("memory:")
        return configured and self.embedded_allowed

    def queue(self, name: str | None = None) -> StoreQueue:
        return self._queues.get(name or self.app.config["SYNCJOBS_QUEUES"][0])

    def worker_queues(
        self,
        names: list[str] | None,
        workers: int | None,
        grace: float | None,
        *,
        timeout: float | None = None,
        keep_result: float | None = None,
    ) -> list[StoreQueue]:
        """Fresh queues for ``flask syncjobs worker`` (what is not None overrides the config)."""
        config = self.app.config
        return [
            self._build(name, workers or config["SYNCJOBS_WORKERS"], grace, timeout=timeout, keep_result=keep_result)
            for name in dict.fromkeys(names or config["SYNCJOBS_QUEUES"])
        ]

    def dispatch(
        self, job: Job, *, delay: Delay = None, run_at: datetime.datetime | None = None, queue: str | None = None
    ) -> JobHandle:
        name = queue or self.app.config["SYNCJOBS_QUEUES"][0]
        # A queue named only here runs in embedded mode too, or its jobs never would.
        self.ensure_embedded(name)
        return self._queues.get(name).dispatch(job, delay=delay, run_at=run_at)

    def ensure_embedded(self, *names: str) -> None:
        """Embedded mode: start this process's workers of ``SYNCJOBS_QUEUES`` (and ``names``), once, after any fork.

        Never once the interpreter exits: a job dispatched then stays queued.
        """
        if self.embedded:
            self._queues.start([*self.app.config["SYNCJOBS_QUEUES"], *names])

    def shutdown(self) -> None:
        """Stop this process's workers, each queue with its grace; a later dispatch starts them again."""
        self._queues.shutdown()

    def _build(
        self,
        name: str,
        workers: int,
        grace: float | None = None,
        *,
        timeout: float | None = None,
        keep_result: float | None = None,
    ) -> StoreQueue:
        config = self.app.config
        options: dict[str, Any] = {
            "workers": workers,
            "shutdown_grace": config["SYNCJOBS_GRACE"] if grace is None else grace,
            "timeout": config["SYNCJOBS_TIMEOUT"] if timeout is None else timeout,
            "keep_result": config["SYNCJOBS_KEEP_RESULT"] if keep_result is None else keep_result,
        }
        if not self.url.startswith("memory:"):
            options["queue"] = name
        queue = connect(self.url, **options)
        if not isinstance(queue, StoreQueue):  # every backend connect() builds is one
            raise TypeError(f"expected a syncjobs queue, got {type(queue).__name__}")
        # Jobs and dead-letter callbacks run inside an app context of this app.
        return self._setup.apply(queue, around=self.app.app_context)
