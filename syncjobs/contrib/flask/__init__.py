"""syncjobs for Flask: ``SyncJobs(app)``, or ``init_app(app)`` for app factories.

Config keys: ``SYNCJOBS_URL`` (default ``memory://``), ``SYNCJOBS_WORKERS``
(4), ``SYNCJOBS_QUEUES`` (``["default"]``), ``SYNCJOBS_GRACE`` (5 seconds),
``SYNCJOBS_EMBEDDED`` (False). Each app's state is
``app.extensions["syncjobs"]``; jobs run inside an app context of the app
that dispatched them. ``flask syncjobs worker`` runs the workers.

Embedded mode (``SYNCJOBS_EMBEDDED = True``, and always with ``memory://``)
runs the worker threads inside the web process: started lazily, on the first
request or dispatch in each process (so a pre-forking server such as gunicorn
forks before any thread exists), and stopped with the grace at exit.
"""

from __future__ import annotations

import os
import threading
from typing import Any, TypeVar

from flask import Flask, current_app

from ...exit_hooks import before_threads_join
from ...job import Job
from ...queue import DEFAULT_SHUTDOWN_GRACE, Delay, StoreQueue, shutdown_in_turn
from ...settings import connect

J = TypeVar("J", bound=type[Job])

DEFAULTS: dict[str, Any] = {
    "SYNCJOBS_URL": "memory://",
    "SYNCJOBS_WORKERS": 4,
    "SYNCJOBS_QUEUES": ["default"],
    "SYNCJOBS_GRACE": DEFAULT_SHUTDOWN_GRACE,
    "SYNCJOBS_EMBEDDED": False,
}


class SyncJobs:
    """The extension: one object for any number of apps."""

    def __init__(self, app: Flask | None = None) -> None:
        self._job_classes: list[type[Job]] = []
        self._states: list[AppQueues] = []
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        for key, value in DEFAULTS.items():
            app.config.setdefault(key, value)
        state = AppQueues(app, self._job_classes)
        self._states.append(state)
        app.extensions["syncjobs"] = state
        app.before_request(state.ensure_embedded)
        from .cli import syncjobs_group  # noqa: PLC0415 - click is loaded only with an app

        app.cli.add_command(syncjobs_group)

    def register(self, job_cls: J) -> J:
        """Make ``job_cls`` runnable by every app's queues; a class decorator."""
        if job_cls not in self._job_classes:
            self._job_classes.append(job_cls)
        for state in self._states:
            state.register(job_cls)
        return job_cls

    def dispatch(self, job: Job, *, delay: Delay = None, queue: str | None = None) -> str:
        """Enqueue ``job`` on the current app's queue; it runs inside that app's context."""
        state: AppQueues = current_app.extensions["syncjobs"]
        return state.dispatch(job, delay=delay, queue=queue)


class AppQueues:
    """One app's queues, built on first use, and rebuilt in a forked child."""

    def __init__(self, app: Flask, job_classes: list[type[Job]]) -> None:
        self.app = app
        self._job_classes = job_classes
        self._lock = threading.Lock()
        self._queues: dict[str, StoreQueue] = {}
        self._pid = os.getpid()
        self._started = False
        #: The pid of the process that registered the exit hook.
        self._hooked = 0
        #: Set by the exit hook: no worker starts any more.
        self._exiting = False
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
        with self._lock:
            self._forget_parent()
            name = name or self.app.config["SYNCJOBS_QUEUES"][0]
            found = self._queues.get(name)
            if found is None:
                found = self._queues[name] = self._build(name, self.app.config["SYNCJOBS_WORKERS"])
            return found

    def worker_queues(self, names: list[str] | None, workers: int | None, grace: float | None) -> list[StoreQueue]:
        """Fresh queues for ``flask syncjobs worker``."""
        config = self.app.config
        return [
            self._build(name, workers or config["SYNCJOBS_WORKERS"], grace)
            for name in dict.fromkeys(names or config["SYNCJOBS_QUEUES"])
        ]

    def register(self, job_cls: type[Job]) -> None:
        with self._lock:
            for queue in self._queues.values():
                queue.register(job_cls)

    def dispatch(self, job: Job, *, delay: Delay = None, queue: str | None = None) -> str:
        self.ensure_embedded()
        return self.queue(queue).dispatch(job, delay=delay)

    def ensure_embedded(self) -> None:
        """Embedded mode: start this process's workers, once, after any fork.

        Never once the interpreter exits: workers started then could not be
        stopped (and Python 3.12+ refuses their threads anyway). A job
        dispatched then stays queued.
        """
        if not self.embedded:
            return
        with self._lock:
            self._forget_parent()
            if self._started or self._exiting:
                return
            self._started = True
        started: list[StoreQueue] = []
        try:
            # Built before the exit hook is registered: an in-memory queue
            # registers its own (no grace) when built, and exit hooks run
            # last-registered first, so ours, with the grace, must come later.
            queues = [self.queue(name) for name in self.app.config["SYNCJOBS_QUEUES"]]
            with self._lock:
                if self._hooked != os.getpid():
                    if not before_threads_join(self._at_exit):
                        self._started = False
                        return  # the interpreter is exiting already
                    self._hooked = os.getpid()
            for queue in queues:
                # Under the lock the exit hook sets _exiting under: a start
                # either comes before its stop, or does not happen.
                with self._lock:
                    if self._exit_began():
                        return
                    queue.start()
                started.append(queue)
        except BaseException:
            shutdown_in_turn(started)  # a queue that failed has stopped itself
            with self._lock:
                self._started = False
            raise

    def shutdown(self) -> None:
        """Stop this process's workers, each queue with its grace; a later dispatch starts them again.

        The queues stay: jobs dispatched meanwhile (by a job running in the
        grace, say) are still in them, not in new ones nobody runs.
        """
        with self._lock:
            queues = list(self._queues.values())
        shutdown_in_turn(queues)
        with self._lock:
            self._started = False

    def _exit_began(self) -> bool:
        # A call, not the attribute inline: the exit hook sets it from another
        # thread, after ensure_embedded() has read it once.
        return self._exiting

    def _at_exit(self) -> None:
        with self._lock:
            # A forked child inherits its parent's hook (not its workers); a
            # child that started workers has its own, and a second shutdown is harmless.
            if self._hooked != os.getpid():
                return
            self._exiting = True
        self.shutdown()

    def _forget_parent(self) -> None:
        # Queues (and their connections) built before a fork belong to the
        # parent: the child builds its own.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._queues = {}
            self._started = False

    def _build(self, name: str, workers: int, grace: float | None = None) -> StoreQueue:
        options: dict[str, Any] = {
            "workers": workers,
            "shutdown_grace": self.app.config["SYNCJOBS_GRACE"] if grace is None else grace,
        }
        if not self.url.startswith("memory:"):
            options["queue"] = name
        queue = connect(self.url, **options)
        if not isinstance(queue, StoreQueue):  # every backend connect() builds is one
            raise TypeError(f"expected a syncjobs queue, got {type(queue).__name__}")
        for job_cls in self._job_classes:
            queue.register(job_cls)
        # Jobs run inside an app context of this app, in the worker thread.
        queue.wrap_runs(self.app.app_context)
        return queue
