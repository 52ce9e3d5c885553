"""What the Django and Flask integrations both do with their queues.

- :class:`JobSetup`: the job classes, run wrappers and dead-letter callbacks
  an integration keeps, applied to every queue it builds, whenever it builds
  it (in a forked child, for a worker command, for a queue named only at
  dispatch), and to the queues already built when one is added later.
- :class:`ProcessQueues`: queues by name, built on first use in each
  process (a forked child, under a pre-forking server, builds its own: the
  parent's connections and threads are not its), whose embedded workers start
  when asked (a request, a dispatch, a server's worker process starting),
  log the worker command's per-run line, and stop with their grace when the
  interpreter exits.
- :func:`log_through`: where nothing shows syncjobs' records (a server such
  as gunicorn leaves the root logger without handlers), hand them to the
  framework's logger, so that they land where the app's own lines do.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TypeVar

from ..dead_letters import DeadLetterCallback
from ..exit_hooks import before_threads_join
from ..hooks import DispatchHook
from ..job import Job
from ..queue import StoreQueue, shutdown_in_turn
from ..scheduler import JobMaker
from ..schedules import Schedule
from ..worker import RunObserver, RunWrapper, log_run

logger = logging.getLogger("syncjobs")
A = TypeVar("A")


class JobSetup:
    """What every queue of an integration gets: job classes, run wrappers, dispatch hooks, observers, callbacks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job_classes: list[type[Job]] = []
        #: What each registration does to a queue (given what its runs happen inside), in the order made.
        self._steps: list[Callable[[StoreQueue, RunWrapper], object]] = []
        #: Each queue applied to, with what its runs and callbacks happen inside.
        self._queues: weakref.WeakKeyDictionary[StoreQueue, RunWrapper] = weakref.WeakKeyDictionary()
        #: Each queue's name in the integration, and the name a schedule without one goes to.
        self._names: weakref.WeakKeyDictionary[StoreQueue, tuple[str, str]] = weakref.WeakKeyDictionary()

    def register(self, job_cls: type[Job]) -> None:
        with self._lock:
            if job_cls in self._job_classes:
                return
            self._job_classes.append(job_cls)
        self._add(lambda queue, _: queue.register(job_cls))

    def wrap_runs(self, wrapper: RunWrapper) -> None:
        self._add(lambda queue, _: queue.wrap_runs(wrapper))

    def around_dispatch(self, hook: DispatchHook) -> None:
        if not callable(hook):
            raise TypeError(f"around_dispatch() takes a callable returning a context manager, got {hook!r}")
        self._add(lambda queue, _: queue.around_dispatch(hook))

    def observe_runs(self, observer: RunObserver) -> None:
        if not callable(observer):
            raise TypeError(f"observe_runs() takes a callable, got {observer!r}")
        self._add(lambda queue, around: queue.observe_runs(_inside(around, observer)))

    def on_dead_letter(self, callback: DeadLetterCallback) -> None:
        if not callable(callback):
            raise TypeError(f"on_dead_letter() takes a callable, got {callback!r}")
        self._add(lambda queue, around: queue.on_dead_letter(_inside(around, callback)))

    def schedule(self, name: str, schedule: Schedule, job: Job | JobMaker, queue: str | None) -> None:
        """Run ``job`` on ``schedule`` on the queue named ``queue`` (None: the default), in each process running it."""
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedule {name!r}: expected a syncjobs.Schedule, got {schedule!r}")

        def add(each: StoreQueue, _: RunWrapper) -> None:
            own, default = self._names.get(each, ("", ""))
            if own == (queue or default):
                each.add_schedule(name, schedule, job)

        self._add(add)

    def _add(self, step: Callable[[StoreQueue, RunWrapper], object]) -> None:
        """Do ``step`` to every queue applied to so far, and to each applied to from now on."""
        with self._lock:
            self._steps.append(step)
            queues = list(self._queues.items())
        for queue, around in queues:
            step(queue, around)

    def apply(self, queue: StoreQueue, around: RunWrapper, *, name: str = "", default: str = "") -> StoreQueue:
        """Give ``queue`` everything registered so far, and what is registered from now on.

        Its runs, observers and dead-letter callbacks happen inside ``around()``
        (a Flask app context, Django's connection housekeeping), the outermost
        wrapper. ``name`` is its name in the integration; ``default``, the
        default queue's (where a schedule that names none runs).
        """
        queue.wrap_runs(around)
        with self._lock:
            self._queues[queue] = around
            self._names[queue] = (name, default)
            steps = list(self._steps)
        for step in steps:
            step(queue, around)
        return queue


def _inside(around: RunWrapper, callback: Callable[[A], object]) -> Callable[[A], object]:
    """``callback``, called inside ``around()``: a dead-letter callback or a run observer on a worker thread."""

    @functools.wraps(callback)
    def call(argument: A) -> object:
        with around():
            return callback(argument)

    return call


class ProcessQueues:
    """An integration's queues in this process, by name: ``build(name)`` makes one on first use."""

    def __init__(self, build: Callable[[str], StoreQueue]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._pid = os.getpid()  # whose queues these are
        self._queues: dict[str, StoreQueue] = {}
        #: Names whose workers run (or are starting) in this process.
        self._started: set[str] = set()
        #: The pid of the process that registered the exit hook.
        self._hooked = 0
        #: Set by the exit hook: no worker starts any more.
        self._exiting = False

    def get(self, name: str) -> StoreQueue:
        with self._lock:
            self._forget_parent()
            queue = self._queues.get(name)
            if queue is None:
                queue = self._queues[name] = self._build(name)
                # Embedded workers have no command to log their runs: the same line, once per queue.
                queue.observe_runs(log_run)
            return queue

    def start(self, names: Iterable[str]) -> None:
        """Run the workers of the queues ``names`` in this process: each once, after any fork.

        Never once the interpreter exits: workers started then could not be
        stopped (and Python 3.12+ refuses their threads anyway). A job
        dispatched then stays queued. A start that fails leaves those queues
        stopped, to be tried again by the next call.
        """
        with self._lock:
            self._forget_parent()
            if self._exiting:
                return
            wanted = [name for name in dict.fromkeys(names) if name not in self._started]
            self._started.update(wanted)
        if not wanted:
            return
        started: list[StoreQueue] = []
        try:
            # Built before the exit hook is registered: an in-memory queue
            # registers its own (no grace) when the first is built, and exit
            # hooks run last-registered first, so ours, with the grace, must come later.
            queues = [self.get(name) for name in wanted]
            with self._lock:
                if self._hooked != os.getpid():
                    if not before_threads_join(self._at_exit):
                        self._started.difference_update(wanted)
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
            shutdown_in_turn(started)  # a queue whose start failed has stopped itself
            with self._lock:
                self._started.difference_update(wanted)
            raise
        from ..cli.worker import describe  # noqa: PLC0415 - the command's module, loaded once workers run

        logger.info("embedded workers started: pid %d, %s", os.getpid(), describe(started))

    def shutdown(self) -> None:
        """Stop this process's workers, each queue with its grace; a later ``start()`` starts them again.

        The queues stay: jobs dispatched meanwhile (by a job running in the
        grace, say) are still in them, not in new ones nobody runs.
        """
        with self._lock:
            queues = list(self._queues.values())
        shutdown_in_turn(queues)
        with self._lock:
            self._started.clear()

    def forget(self) -> list[StoreQueue]:
        """Drop every queue (settings changed); returns them, for the caller to shut down."""
        with self._lock:
            queues = list(self._queues.values())
            self._queues.clear()
            self._started.clear()
        return queues

    def _exit_began(self) -> bool:
        # A call, not the attribute inline: the exit hook sets it from another
        # thread, after start() has read it once.
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
        # parent: the child builds its own. Called under the lock.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._queues = {}
            self._started = set()


class LogFallback(logging.Handler):
    """Hands syncjobs' records to a framework's logger while no other handler would take them.

    It steps aside for good once one would (logging configured later), so a
    record is never shown twice.
    """

    def __init__(self, target: logging.Logger, *, raised_level: bool) -> None:
        super().__init__()
        self.target = target
        #: It set the ``syncjobs`` logger to INFO, and puts it back when it steps aside.
        self._raised_level = raised_level
        self._aside = False

    def emit(self, record: logging.LogRecord) -> None:
        if self._aside:
            return
        if self._taken_elsewhere(logging.getLogger(record.name)):
            self._step_aside()
            return
        # handle(), not log(): the target's level does not apply (a production app
        # logger is at WARNING by default), only its handlers and filters do.
        self.target.handle(record)

    def _taken_elsewhere(self, source: logging.Logger) -> bool:
        current: logging.Logger | None = source
        while current is not None:
            if any(handler is not self for handler in current.handlers):
                return True
            current = current.parent if current.propagate else None
        return False

    def _step_aside(self) -> None:
        self._aside = True
        if self._raised_level:
            library = logging.getLogger("syncjobs")
            if library.level == logging.INFO:
                library.setLevel(logging.NOTSET)


_fallback_lock = threading.Lock()
#: Set once this process has looked (at its embedded workers' first start): it looks once.
_looked = threading.Event()


def log_through(target: logging.Logger) -> None:
    """If nothing shows syncjobs' records, send them (INFO and up) to ``target``'s handlers; once per process.

    Logging configured anywhere on the way (the root logger, ``syncjobs``)
    keeps them: they propagate as usual, and nothing is added. A ``syncjobs``
    logger left at NOTSET is set to INFO: the per-run lines are INFO, and
    Python's last resort shows only WARNING and up, without a format.
    """
    if _looked.is_set():
        return
    library = logging.getLogger("syncjobs")
    with _fallback_lock:
        if _looked.is_set():
            return
        _looked.set()
        if library.hasHandlers() or not target.hasHandlers():
            return
        raise_level = library.level == logging.NOTSET
        library.addHandler(LogFallback(target, raised_level=raise_level))
        if raise_level:
            library.setLevel(logging.INFO)
