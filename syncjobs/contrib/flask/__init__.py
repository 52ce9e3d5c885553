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
runs the worker threads inside the web process, and stops them with the grace
at exit. Under gunicorn they start as soon as each worker process has the
app: at ``init_app`` in a worker that builds it, just after the fork in one
that a ``--preload`` master forked (the master itself never runs any). Elsewhere
they start on the first request or dispatch in each process, or when a
server's post-fork hook calls :func:`start_embedded`. Their records go where
the app's do (see :func:`..integration.log_through`).

``init_dashboard(app)`` serves the web dashboard (``syncjobs.web``) of the
app's jobs table under a prefix of the app's URLs, behind a token, a user and
password, or the app's own login.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from flask import Flask, current_app
from typing_extensions import Unpack
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from ...database import DatabaseJobQueue
from ...dead_letters import DeadLetterCallback
from ...function_tasks import FunctionJob, TaskDecorator
from ...hooks import DispatchHook
from ...job import Job
from ...protocols import Delay
from ...queue import DEFAULT_SHUTDOWN_GRACE, StoreQueue
from ...scheduler import JobMaker
from ...schedules import Schedule, When
from ...settings import connect
from ...status import DEFAULT_KEEP_RESULT, JobHandle
from ...web import Access, Board, queue_board
from ...web.access import Environ
from ...web.mounted import QueueDashboard
from ...worker import RunObserver, RunWrapper
from ..integration import JobSetup, ProcessQueues, log_through

J = TypeVar("J", bound=type[Job])
C = TypeVar("C", bound=DeadLetterCallback)
H = TypeVar("H", bound=DispatchHook)
R = TypeVar("R", bound=RunObserver)

logger = logging.getLogger("syncjobs")

_DISPATCH_OPTIONS = frozenset({"delay", "run_at", "priority", "queue"})

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
        app.before_request(state.before_request)
        from .cli import syncjobs_group  # noqa: PLC0415 - click is loaded only with an app

        app.cli.add_command(syncjobs_group)
        _start_early(state)

    def init_dashboard(
        self,
        app: Flask,
        url_prefix: str = "/jobs",
        *,
        token: str | None = None,
        user: str | None = None,
        password: str | None = None,
        authorize: Callable[[], object] | None = None,
        refresh_seconds: float = 2.0,
    ) -> None:
        """Serve the web dashboard of the app's jobs table (``SYNCJOBS_URL``'s, every queue in it) at ``url_prefix``.

        Exactly one way in, never none: ``token``, or ``user`` and ``password``
        (the dashboard's own login page); or ``authorize``, a callable of no
        arguments for an app with a login of its own, called for each request
        to the dashboard inside a request context of the app for that request,
        so that it can read ``session`` or flask-login's ``current_user``
        (not the form: the dashboard reads that); false means 403.

        Mounted in front of the app (werkzeug's ``DispatcherMiddleware`` on
        ``app.wsgi_app``): the dashboard's requests skip the app's own
        ``before_request`` hooks and error handlers. After :meth:`init_app`.
        """
        state = app.extensions.get("syncjobs")
        if not isinstance(state, AppQueues):
            raise RuntimeError("init_dashboard(app): call init_app(app) first")
        prefix = _mount_prefix(url_prefix)
        if state.url.startswith("memory:"):
            raise ValueError(
                f"init_dashboard(app): SYNCJOBS_URL is {state.url}; the dashboard shows a database's jobs table"
            )
        if not refresh_seconds > 0:
            raise ValueError(f"refresh_seconds must be more than 0, got {refresh_seconds!r}")
        check = None if authorize is None else _in_request_context(app, authorize)
        access = Access(token=token, user=user, password=password, authorize=check)
        # Built at its first request, on the app's default queue's connections (so the same table).
        mounted = QueueDashboard(state.queue, _dashboard_board, access, refresh_seconds=refresh_seconds)
        app.wsgi_app = DispatcherMiddleware(app.wsgi_app, {prefix: mounted})  # type: ignore[method-assign]

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

    def around_dispatch(self, hook: H) -> H:
        """Enter ``hook(job)`` (a context manager) around every dispatch to any app's queues; a decorator.

        See ``StoreQueue.around_dispatch``: a context variable it sets travels
        with the job, and raising ``QueueError`` refuses the dispatch.
        """
        self._setup.around_dispatch(hook)
        return hook

    def observe_runs(self, observer: R) -> R:
        """Call ``observer(report)`` after every run of any app's queues (a ``RunReport``), in its app context.

        On the worker's thread; one that raises is logged and changes nothing.
        """
        self._setup.observe_runs(observer)
        return observer

    @property
    def task(self) -> TaskDecorator:
        """``@jobs.task`` (or ``@jobs.task(name=…, max_attempts=…, retry_wait=…, queue=…)``) on a module-level function.

        ``f.dispatch(…)`` enqueues a call on the current app's queue, as
        :meth:`dispatch` does; ``f.using(delay=…, queue=…)`` sets options first.
        """
        return TaskDecorator(
            self.register, self.dispatch, _DISPATCH_OPTIONS, frozenset({"queue"}), schedule=self._schedule_task
        )

    def schedule(self, name: str, job: Job | JobMaker, *, queue: str | None = None, **when: Unpack[When]) -> None:
        """Dispatch ``job`` (or ``job(slot)``) at each slot, on ``queue`` (default: the first of ``SYNCJOBS_QUEUES``).

        Every process that runs the queue's workers (embedded, or ``flask
        syncjobs worker``) dispatches its slots, one job per slot in all.
        ``when``: as ``StoreQueue.schedule`` takes it.
        """
        self._setup.schedule(name, Schedule(**when), job, queue)

    def _schedule_task(
        self, name: str, schedule: Schedule, job_class: type[FunctionJob], options: Mapping[str, Any]
    ) -> None:
        self._setup.schedule(name, schedule, lambda slot: job_class([], {}), options.get("queue"))

    def dispatch(
        self,
        job: Job,
        *,
        delay: Delay = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> JobHandle:
        """Enqueue ``job`` on the current app's queue (it runs inside that app's context); returns its handle."""
        state: AppQueues = current_app.extensions["syncjobs"]
        return state.dispatch(job, delay=delay, run_at=run_at, priority=priority, queue=queue)


class AppQueues:
    """One app's queues, built on first use in each process."""

    def __init__(self, app: Flask, setup: JobSetup) -> None:
        self.app = app
        self._setup = setup
        self._queues = ProcessQueues(lambda name: self._build(name, self.app.config["SYNCJOBS_WORKERS"]))
        #: False in a process that ``flask syncjobs worker`` runs: it has its workers.
        self.embedded_allowed = True
        #: The process that built the app: its forked children start their workers at once (under gunicorn).
        self.home_pid = os.getpid()
        #: A process that starts no worker (a gunicorn master that forks its workers from the app), or 0.
        self.forks_first = 0
        _apps.add(self)

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
        self,
        job: Job,
        *,
        delay: Delay = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> JobHandle:
        name = queue or self.app.config["SYNCJOBS_QUEUES"][0]
        # A queue named only here runs in embedded mode too, or its jobs never would.
        self.ensure_embedded(name)
        return self._queues.get(name).dispatch(job, delay=delay, run_at=run_at, priority=priority)

    def before_request(self) -> None:
        """Embedded mode: a process that serves requests runs its workers, whatever was guessed at init_app."""
        if self.forks_first == os.getpid():
            self.forks_first = 0  # not a master that only forks workers, after all
        self.ensure_embedded()

    def start(self) -> None:
        """Embedded mode: start this process's workers now, not at the first request; a no-op otherwise.

        For a server's post-fork hook (uWSGI's ``@postfork``, say); under
        gunicorn they start by themselves.
        """
        self.ensure_embedded()

    def ensure_embedded(self, *names: str) -> None:
        """Embedded mode: start this process's workers of ``SYNCJOBS_QUEUES`` (and ``names``), once, after any fork.

        Never once the interpreter exits (a job dispatched then stays queued),
        nor in a process that forks its workers from this one.
        """
        if self.embedded and self.forks_first != os.getpid():
            log_through(self.app.logger)
            self._queues.start([*self.app.config["SYNCJOBS_QUEUES"], *names])

    def start_or_log(self) -> None:
        """:meth:`start` where no caller could take an error: it is logged; the next request or dispatch tries again."""
        try:
            self.start()
        except Exception:
            logger.exception(
                "embedded workers of app %r could not start; the next request or dispatch tries again", self.app.name
            )

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
        return self._setup.apply(queue, around=self.app.app_context, name=name, default=config["SYNCJOBS_QUEUES"][0])


def _dashboard_board(queue: StoreQueue) -> Board:
    if not isinstance(queue, DatabaseJobQueue):
        raise TypeError(f"the dashboard shows a database's jobs table, not a {type(queue).__name__}'s jobs")
    return queue_board(queue)


def _mount_prefix(url_prefix: str) -> str:
    """``url_prefix`` as DispatcherMiddleware matches it: a leading slash, no trailing one; never the root."""
    prefix = "/" + url_prefix.strip("/")
    if prefix == "/":
        raise ValueError("init_dashboard(app, url_prefix=...): a path below the app's root, such as /jobs")
    return prefix


def _in_request_context(app: Flask, authorize: Callable[[], object]) -> Callable[[Environ], bool]:
    """``authorize()`` as the dashboard calls it: inside the app's request context for the request's environ."""

    def check(environ: Environ) -> bool:
        with app.request_context(dict(environ)):
            return bool(authorize())

    return check


#: Every app's state in this process (and, after a fork, its parent's).
_apps: weakref.WeakSet[AppQueues] = weakref.WeakSet()
_fork_hook_lock = threading.Lock()
_fork_hooked = False


def start_embedded() -> None:
    """Start the embedded workers of every app (with embedded mode) this process has; for a server's post-fork hook.

    A failure is logged, not raised: the next request or dispatch tries again.
    """
    for state in list(_apps):
        state.start_or_log()


def _start_early(state: AppQueues) -> None:
    """Under gunicorn: start now in a worker, or right after the fork in each worker a ``--preload`` master forks.

    The workers then share the jobs from the start, not each from its first
    request. Elsewhere nothing starts here: ``flask`` commands and scripts
    build the app too, and must not take jobs.
    """
    role = _gunicorn_role()
    if role == "worker":
        state.start_or_log()
    elif role == "master":
        state.forks_first = os.getpid()  # no thread here: threads do not survive a fork
        _hook_forks()


def _gunicorn_role() -> str | None:
    """``"worker"`` in a gunicorn worker process, ``"master"`` in its master (``--preload``), else None."""
    # gunicorn's master sets it in its environment, which its workers inherit.
    if not os.environ.get("SERVER_SOFTWARE", "").startswith("gunicorn/"):
        return None
    base = sys.modules.get("gunicorn.workers.base")
    # A worker sets its signal handlers before it loads the app; the master sets its own after (--preload).
    handler = signal.getsignal(signal.SIGTERM)
    if base is not None and isinstance(getattr(handler, "__self__", None), base.Worker):
        return "worker"
    return "master" if "gunicorn.arbiter" in sys.modules else None


def _hook_forks() -> None:
    global _fork_hooked  # noqa: PLW0603 - one hook per process: it serves every app
    with _fork_hook_lock:
        if _fork_hooked:
            return
        _fork_hooked = True
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _after_fork_in_child() -> None:
    # Only in a child of the process that built the app (a gunicorn worker), not
    # in a grandchild (a job's multiprocessing pool): that is another program.
    forked = [state for state in list(_apps) if state.home_pid == os.getppid() and state.forks_first]
    if not forked:
        return
    # Not here, inside fork(): the forking code (gunicorn's worker setup) has
    # not run yet, and a start connects to the database and may wait. A thread
    # starts them as the child goes on; a request or a dispatch first starts
    # them itself, and this start then finds them running.
    threading.Thread(target=_start_all, args=(forked,), name="syncjobs-embedded-start", daemon=True).start()


def _start_all(states: list[AppQueues]) -> None:
    for state in states:
        state.start_or_log()
