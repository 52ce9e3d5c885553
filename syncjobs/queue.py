"""The queue logic every backend shares (the ``JobQueue`` protocol is in ``protocols``)."""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import TracebackType
from typing import Any, ClassVar

from typing_extensions import Self, Unpack

from .context import carried_context
from .dead_letters import DeadLetterHandlers
from .envelope import Envelope, PrioritizedEnvelope, envelope_kind
from .errors import QueueError
from .exit_hooks import exit_watch
from .function_tasks import FunctionJob, TaskDecorator
from .hooks import DispatchHook, DispatchHooks, DispatchObserver, already_given
from .ids import new_job_id
from .job import DEFAULT_PRIORITY, MAX_NAME_LENGTH, Job, check_keep_result, check_priority, check_timeout
from .limits import LimitKey
from .payload import decode, encode
from .protocols import C, Delay, J, QueueStore
from .registry import JobFinder, Registry
from .scheduler import JobMaker, MemoryRecords, Periodic, Scheduler, ScheduleRecords, ScheduleState, slot_key
from .schedules import Schedule, When
from .status import DEFAULT_KEEP_RESULT, JobHandle, JobStatus, QueueCounts, handle_type, utc, wait_for_result
from .unique import UniqueKey
from .worker import RunLimit, RunObserver, RunWrapper, WorkerPool

logger = logging.getLogger("syncjobs")

#: Seconds running jobs get at ``shutdown()`` before they are asked to cancel.
DEFAULT_SHUTDOWN_GRACE = 5.0
#: What closing the store gets at least, when the grace is spent already.
_CLOSE_AT_LEAST = 1.0
#: At interpreter exit there is no grace: closing gets this long to hand the running jobs back.
_CLOSE_AT_EXIT = 2.0


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A checked job with its id, not yet enqueued: ``submit()`` does that, once."""

    id: str
    name: str
    #: Enqueues the job; for a unique job whose key another holds by then, enqueues nothing and returns that one's id.
    submit: Callable[[], str | None]


class StoreQueue:
    """A ``JobQueue`` over one store: registration, dispatch checks, lifecycle."""

    #: Whether a running job that cancel() finds is always this process's own (in memory), rather
    #: than possibly another's (a database, where the holder's heartbeat tells it).
    cancels_only_here: ClassVar[bool] = True
    #: The keyword arguments ``dispatch()`` takes after the job (what a task's ``using()`` takes).
    dispatch_options: ClassVar[frozenset[str]] = frozenset({"delay", "run_at", "priority"})
    #: Where unique jobs' keys hold: one store's jobs (in memory), one queue's of a table.
    unique_scope: str = ""

    def __init__(
        self,
        store: QueueStore,
        *,
        workers: int,
        shutdown_grace: float,
        clock: Callable[[], float] = time.monotonic,
        timeout: float | None = None,
        keep_result: float = DEFAULT_KEEP_RESULT,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an int >= 0, got {workers!r}")
        try:
            check_timeout(timeout, "timeout")
            check_keep_result(keep_result, "keep_result")
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        self.shutdown_grace = _check_grace(shutdown_grace, "shutdown_grace")
        self.workers = workers
        self._store = store
        self._registry = Registry()
        self._dead_letters = DeadLetterHandlers()
        self._dispatch_hooks = DispatchHooks()
        self._dispatch_observers: list[DispatchObserver] = []
        self._pool = WorkerPool(
            store,
            self._registry,
            self._dead_letters,
            workers=workers,
            clock=clock,
            timeout=timeout,
            keep_result=float(keep_result),
        )
        # start() and shutdown() one at a time; re-entrant so that a signal
        # handler calling shutdown() in the middle of start() cannot deadlock.
        self._lifecycle = threading.RLock()
        self._handle_type = handle_type(self)
        self._duplicate_type = handle_type(self, duplicate=True)
        #: Where dispatches go instead while a test diverts them (see ``divert_dispatches``).
        self._diverted_to: StoreQueue | None = None
        self._scheduler = Scheduler(self._dispatch_slot, self._schedule_records())
        store.limit_with(self._limit_of, lambda: self._registry.any_limited)
        exit_watch.watch(self)

    def share_jobs_of(self, other: StoreQueue) -> None:
        """Run ``other``'s job classes, inside its run wrappers, and call its dead-letter callbacks."""
        if self._pool.started:
            raise QueueError("a started queue cannot take another's jobs")
        self._pool.share_jobs_of(other._pool)
        self._registry = other._registry
        self._dead_letters = other._dead_letters
        self._dispatch_hooks = other._dispatch_hooks

    def register(self, job_cls: J) -> J:
        """Make ``job_cls`` runnable by this queue; usable as a class decorator."""
        return self._registry.register(job_cls)

    def find_job_classes_with(self, finder: JobFinder) -> None:
        """Call ``finder(name)`` for a NAME no registered class has, when a run meets one, before giving up on it.

        It returns the job class for that NAME (registered from then on) or
        None; it may import the module that defines it. Integrations use it
        to run jobs whose module the worker process has not imported yet (a
        Django task is found by its path). A finder that raises is logged and
        counts as None.
        """
        self._registry.find_with(finder)

    def registered_names(self) -> list[str]:
        """The NAMEs of the job classes this queue runs, sorted."""
        return self._registry.names()

    @property
    def task(self) -> TaskDecorator:
        """``@queue.task`` makes a module-level function a task of this queue: ``f.dispatch(…)`` enqueues a call.

        Also ``@queue.task(name=…, max_attempts=…, retry_wait=…)``. The name
        defaults to the function's dotted path; give a stable ``name=`` if the
        function may move or be renamed while calls of it are queued.
        """
        return TaskDecorator(self.register, self.dispatch, self.dispatch_options, schedule=self._schedule_task)

    def dispatch(
        self,
        job: Job,
        *,
        delay: Delay = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
    ) -> JobHandle:
        """Enqueue ``job``; returns its handle, which is its id. Nothing is enqueued when it raises ``QueueError``.

        ``delay`` (seconds or a ``timedelta``) or ``run_at`` (an aware
        ``datetime``) holds it back. ``priority`` (-100 to 100, higher first;
        default the class's ``PRIORITY``) orders it among the jobs due.
        """
        if self._diverted_to is not None:
            return self._diverted_to.dispatch(job, delay=delay, run_at=run_at, priority=priority)
        if self._dispatch_hooks.active:
            envelope, seconds, unique = self._checked(job, delay, run_at, priority)
        else:  # the same, one call fewer: a dispatch pays for each
            envelope, seconds, unique = self._check(job, delay, run_at, priority)
        holder = self._put(envelope, seconds, unique)
        if holder is None:
            return self._handle_type(envelope.id)
        return self.handle_of(envelope.name, envelope.id, holder)

    def _put(self, envelope: Envelope, seconds: float, unique: UniqueKey | None) -> str | None:
        """Enqueue a checked envelope; the holder of its unique key if that one is enqueued instead."""
        return self._enqueued(envelope.name, self._store.put(envelope, seconds, unique))

    def _enqueued(self, name: str, holder: str | None) -> str | None:
        """Tell the dispatch observers of a job of ``name`` enqueued (``holder`` None: not a duplicate)."""
        if holder is None and self._dispatch_observers:
            for observer in self._dispatch_observers:
                try:
                    observer(name)
                except Exception:  # an observer's bug must not fail a dispatch that is done
                    logger.exception("dispatch observer %r failed", observer)
        return holder

    def _limit_of(self, envelope: Envelope) -> LimitKey | None:
        """The limit key of a claimed job whose class declares ``LIMIT`` (None for the others: a dict lookup)."""
        job_cls = self._registry.get(envelope.name)  # a finder may find it: a class of a NAME not seen yet
        if job_cls is None or job_cls.LIMIT is None:
            return None
        limit = job_cls.LIMIT
        if not limit.fields and limit.key is None:  # one key for the NAME: no payload to read
            return limit.key_of(envelope.name, {}, self.unique_scope)
        try:
            job = job_cls.from_payload(decode(envelope.payload))
            return job_cls.LIMIT.key_of(envelope.name, job.unique_values(), self.unique_scope)
        except Exception:
            # Checked at its dispatch: only a payload from elsewhere (another version of the job) gets here.
            # Its run fails the same way, where the worker loop reports it; its limit cannot hold it back.
            logger.error(
                "job %s (%s): its limit key cannot be made; it runs without its limit",
                envelope.name,
                envelope.id,
                exc_info=True,
            )
            return None

    def handle_of(self, name: str, job_id: str, holder: str | None) -> JobHandle:
        """What a dispatch returns: its job's handle or, if ``holder`` held its unique key, that one's (a duplicate)."""
        if holder is None:
            return self._handle_type(job_id)
        logger.debug("job %s (%s): a duplicate of %s, which holds its unique key; not enqueued", name, job_id, holder)
        return self._duplicate_type(holder)

    # -- periodic jobs ------------------------------------------------------------

    def schedule(self, name: str, job: Job | JobMaker, **when: Unpack[When]) -> None:
        """Dispatch ``job`` at every slot of a ``cron`` expression (in time zone ``tz``) or ``every`` N seconds.

        ``job`` is a job, or a function of the slot (an aware datetime in
        ``tz``) that makes one. ``name`` is the schedule's stable name: its
        slots are recorded under it. Each process that runs this queue's
        workers dispatches the slots; one job per slot is enqueued, whatever
        the number of processes. ``when`` is :class:`~syncjobs.Schedule`'s
        arguments (``cron``, ``every``, ``tz``, ``catch_up``, ``grace``).
        """
        self.add_schedule(name, Schedule(**when), job)

    def add_schedule(self, name: str, schedule: Schedule, job: Job | JobMaker) -> None:
        """:meth:`schedule` with a :class:`~syncjobs.Schedule` made already."""
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LENGTH or not name.isprintable():
            raise QueueError(f"a schedule's name must be 1 to {MAX_NAME_LENGTH} printable characters, got {name!r}")
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedule {name!r}: expected a syncjobs.Schedule, got {schedule!r}")
        if isinstance(job, Job):
            made = job
            maker: JobMaker = lambda slot: made  # noqa: E731 - the same job at every slot
        elif callable(job):
            maker = job
        else:
            raise TypeError(f"schedule {name!r}: job must be a syncjobs.Job or a function of the slot, got {job!r}")
        periodic = Periodic(name, schedule, maker)
        if self._pool.started:  # else start() checks it
            self._check_schedules([periodic])
        self._scheduler.add(periodic)

    def _schedule_task(
        self, name: str, schedule: Schedule, job_class: type[FunctionJob], options: Mapping[str, Any]
    ) -> None:
        self.add_schedule(name, schedule, lambda slot: job_class([], {}))

    def schedules(self) -> list[ScheduleState]:
        """This queue's schedules, with the last slot dispatched (by any process) and the next one."""
        last = self._scheduler.records.last_slots()
        # A slot due this very instant is still the next one: look from just before now.
        now = time.time() - 1e-6
        states = []
        for each in self._scheduler.periodic():
            at = last.get(each.name)
            following = each.schedule.next_after(now if at is None else max(at, now))
            states.append(ScheduleState(each.name, each.schedule.describe(), utc(at), utc(following)))
        return states

    def _schedule_records(self) -> ScheduleRecords:
        """Where this queue keeps its schedules' last slots: its process's memory; a table, on a database."""
        return MemoryRecords()

    def _dispatch_slot(self, periodic: Periodic, slot: float) -> JobHandle:
        """Dispatch the job of one slot under the slot's unique key: the first process to do so enqueues it."""
        job = periodic.job_for(slot)
        envelope, _, _ = self._checked(job, None, None, None)
        holder = self._put(envelope, 0.0, slot_key(self.unique_scope, periodic.name, slot))
        if holder is None:
            logger.debug(
                "schedule %r: dispatched job %s (%s) for %s",
                periodic.name,
                envelope.name,
                envelope.id,
                periodic.schedule.local(slot).isoformat(),
            )
        return self.handle_of(envelope.name, envelope.id, holder)

    def _check_schedules(self, periodic: Iterable[Periodic] | None = None) -> None:
        """Each schedule makes a job this queue can dispatch: refused at start() if not, naming the schedule."""
        for each in self._scheduler.periodic() if periodic is None else periodic:
            try:
                new_envelope(self._registry, each.job_for(each.schedule.next_after(time.time())))
            except QueueError as exc:
                raise QueueError(f"schedule {each.name!r}: {exc.message}") from exc

    def divert_dispatches(self, to: StoreQueue | None) -> StoreQueue | None:
        """Make every dispatch through this queue (and its tasks) on ``to`` instead; None ends it. Returns the last.

        For tests (see ``syncjobs.testing``): the app's code dispatches as it
        does in production, and the test runs what it dispatched. A database
        queue's ``connection=`` is not used then: the jobs go to ``to`` at once.
        """
        before, self._diverted_to = self._diverted_to, to
        return before

    def handle(self, job_id: str) -> JobHandle:
        """A handle of this queue's job ``job_id`` (an id stored earlier, say), to ask its status or result."""
        if not isinstance(job_id, str):
            raise TypeError(f"a job id is a string, got {type(job_id).__name__}")
        return self._handle_type(str(job_id))

    def status(self, job_id: str) -> JobStatus | None:
        """The job's record: queued, scheduled, running, retrying, done or dead, with its counts and times.

        None when there is no record: never dispatched, or finished longer
        than its ``keep_result`` ago.
        """
        if not isinstance(job_id, str):
            raise TypeError(f"a job id is a string, got {type(job_id).__name__}")
        return self._store.status(job_id)

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait up to ``timeout`` seconds (None: for ever) for the job to end; what its run returned.

        Raises ``JobFailed`` (its ``status`` says why) for a dead job,
        ``JobNotFound`` when there is no record of it, and ``TimeoutError``.
        """
        return wait_for_result(job_id, timeout, self.status, self._store.wait_finished)

    def cancel(self, job_id: str) -> bool:
        """Cancel the job; True if it had not finished (it now ends cancelled), False if it had or is unknown.

        A queued, delayed or parked job never runs: it is cancelled at once. A
        running one has its cancel token set (at once in this process; in
        another, by its next heartbeat) and ends cancelled when its run
        returns, however it returns: it is not retried, nor a dead letter.
        """
        if not isinstance(job_id, str):
            raise TypeError(f"a job id is a string, got {type(job_id).__name__}")
        found = self._store.cancel(job_id)
        if found == "requested":
            self._pool.cancel_run(job_id, remember=self.cancels_only_here)
        return found is not None

    @property
    def keep_result(self) -> float:
        """Seconds a finished job's record is kept, for jobs without a ``KEEP_RESULT`` of their own."""
        return self._pool.keep_result

    def prepare(
        self,
        job: Job,
        *,
        delay: Delay = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
    ) -> Prepared:
        """Check ``job`` now and give it its id; ``submit()`` enqueues it later (say, on commit).

        Every check ``dispatch()`` makes happens here, where the mistake is.
        """
        if self._diverted_to is not None:
            return self._diverted_to.prepare(job, delay=delay, run_at=run_at, priority=priority)
        envelope, seconds, unique = self._checked(job, delay, run_at, priority)
        return Prepared(envelope.id, envelope.name, lambda: self._put(envelope, seconds, unique))

    def _checked(
        self, job: Job, delay: Delay, run_at: datetime.datetime | None, priority: int | None
    ) -> tuple[Envelope, float, UniqueKey | None]:
        """The job's envelope, delay in seconds and unique key, or ``QueueError`` naming the job.

        Inside the dispatch hooks, which see every check's refusal (and where the caller's context is copied).
        """
        if not self._dispatch_hooks.active:
            return self._check(job, delay, run_at, priority)
        return self._dispatch_hooks.around(job, lambda: self._check(job, delay, run_at, priority))

    def _check(
        self, job: Job, delay: Delay, run_at: datetime.datetime | None, priority: int | None
    ) -> tuple[Envelope, float, UniqueKey | None]:
        envelope = new_envelope(self._registry, job, priority)
        seconds = 0.0 if delay is None and run_at is None else delay_seconds(envelope.name, delay, run_at)
        job_cls = type(job)
        unique = None
        if job_cls.UNIQUE is not None or job_cls.LIMIT is not None:  # most jobs declare neither: no call
            unique = unique_key(job, self.unique_scope)
            limit_key(job, self.unique_scope)  # a key that cannot be made is refused here, not at its claim
        self._check_envelope(envelope)
        return envelope, seconds, unique

    def _check_envelope(self, envelope: Envelope) -> None:
        """What a backend refuses beyond the common checks; nothing here."""

    def start(self, *, held: bool = False) -> None:
        """Spawn the workers; a no-op while they run, a fresh set after ``shutdown()``.

        ``held``, they take no job until :meth:`release` (or ``shutdown()``):
        what the worker commands use to print their readiness line before
        any job runs. Asking a running queue for held workers is an error.
        """
        with self._lifecycle:
            if held and self._pool.started:
                raise QueueError("start(held=True): this queue's workers run already")
            if not self._pool.started:
                self._check_schedules()
                try:
                    self._store.open()
                    self._pool.start(held=held)
                    self._scheduler.start()
                except BaseException:
                    # Some threads may have started, and a worker taken a job,
                    # before one could not (no thread may start once the
                    # interpreter exits): stop them as shutdown() would, so a
                    # failed start() leaves nothing running and nothing taken.
                    self._scheduler.stop()
                    try:
                        self._pool.shutdown(self.shutdown_grace)
                    finally:
                        self._store.close()
                    raise
                exit_watch.started(self)

    def release(self) -> None:
        """Let workers started ``held`` take jobs; a no-op otherwise."""
        self._pool.release()

    def shutdown(self, grace: float | None = None) -> None:
        """Stop the workers within about ``grace`` seconds (default ``shutdown_grace``)."""
        grace = self.shutdown_grace if grace is None else _check_grace(grace, "grace")
        with self._lifecycle:
            # close() writes what it can in what is left of the grace (at least
            # a moment, to hand back the jobs claimed for no one).
            deadline = time.monotonic() + grace
            try:
                self._scheduler.stop()
                self._pool.shutdown(grace)
                self._store.close(max(deadline, time.monotonic() + _CLOSE_AT_LEAST))
            finally:
                exit_watch.stopped(self)

    def stop_at_exit(self) -> None:
        """The interpreter exits with this queue started here and never shut down: stop it, with no grace.

        Called by the exit hook, before the interpreter joins the worker
        threads (which would otherwise wait in the store forever).
        """
        if not exit_watch.running_here(self):
            return
        with self._lifecycle:
            try:
                self._scheduler.stop(timeout=_CLOSE_AT_EXIT)
                handed_back = self._pool.shutdown(0.0)
                self._store.close(time.monotonic() + _CLOSE_AT_EXIT)
            finally:
                exit_watch.stopped(self)
        logger.warning(
            "the interpreter is exiting with a started %s that was never shut down: its workers were stopped "
            "with no grace and %d running job(s) handed back (call shutdown() before exit)",
            type(self).__name__,
            handed_back,
            extra={"handed_back": handed_back},
        )

    @property
    def timeout(self) -> float | None:
        """Seconds a run of a job without a ``TIMEOUT`` of its own may take (None: no limit)."""
        return self._pool.timeout

    def settle_timers(self, timeout: float = 5.0) -> bool:
        """Wait until what the queue's clock has made due is handed over (for tests with an injected clock)."""
        return self._pool.settle_timers(timeout)

    def worker_threads(self) -> list[threading.Thread]:
        """The threads of this queue's running workers."""
        return self._pool.threads()

    def stop_claiming(self) -> None:
        """Take no new job from now on; running jobs go on. ``shutdown()`` still stops the workers."""
        self._pool.stop_claiming()

    def end_grace(self) -> None:
        """Cut the grace of a ``shutdown()`` in progress (or about to start) short.

        For a second Ctrl-C: running jobs are cancelled and handed back at
        once. Call it from another thread than the one in ``shutdown()``.
        """
        self._pool.end_grace()

    def around_dispatch(self, hook: DispatchHook) -> DispatchHook:
        """Enter ``hook(job)`` (a context manager) around each dispatch of this queue; usable as a decorator.

        It is entered while the job is checked and the caller's context
        copied: a context variable it sets travels with the job (on a
        database, when the queue carries that variable). Raising ``QueueError``
        refuses the dispatch, and nothing is enqueued; any other error of a
        hook is logged and the job goes out without it.
        """
        self._dispatch_hooks.add(hook)
        return hook

    def wrap_runs(self, wrapper: RunWrapper) -> None:
        """Enter ``wrapper()`` (a context manager) around every run, in the worker thread.

        What integrations use to run jobs inside a Flask app context, or between
        Django's connection housekeeping.
        """
        self._pool.wrap(wrapper)

    def limit_runs(self, limit: RunLimit) -> None:
        """Begin no more runs than ``limit`` allows (shared by queues that count together).

        Counted when a worker takes a job, not when the run ends: with many
        workers, no more than the limit ever begin.
        """
        self._pool.limit(limit)

    def observe_dispatches(self, observer: DispatchObserver) -> None:
        """Call ``observer(name)`` after each job this queue enqueues, in the dispatching thread; once if given twice.

        Not for a dispatch refused, nor for a unique job's duplicate (nothing
        is enqueued). On a database, with ``connection=``, when the row is
        inserted in the caller's transaction.
        """
        if not already_given(self._dispatch_observers, observer):
            self._dispatch_observers.append(observer)

    def observe_runs(self, observer: RunObserver) -> None:
        """Call ``observer(report)`` after every run (a :class:`RunReport`), on the worker's thread."""
        self._pool.observe(observer)

    def drained(self) -> bool:
        """Nothing on this queue is ready to run and none of its jobs runs here.

        Jobs delayed or waiting for a retry's backoff do not count: what
        ``syncjobs worker --burst`` waits for before it exits.
        """
        # The store first: a run taken after the store has no ready job would make it undrained again.
        return self._store.drained() and not self._pool.busy()

    def wait_finished(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for one of this process's runs to finish."""
        self._store.wait_finished(timeout)

    def pending_count(self) -> int:
        """Jobs not yet finished: queued, running and parked for a retry or a delay."""
        return self._store.pending()

    def running_here(self) -> int:
        """Runs of this queue in progress in this process now (a run abandoned at its timeout no longer counts)."""
        return self._pool.running()

    @property
    def jobs_source(self) -> Hashable:
        """Where :meth:`counts` reads: two queues of one source count the same jobs (twins on a table do)."""
        return ("memory", id(self))

    def carry_also(self, var: contextvars.ContextVar[Any]) -> None:
        """Make ``var`` travel with each job dispatched from now on: in memory every context variable does already."""

    @property
    def queue_label(self) -> str:
        """What metrics and views call this queue: its name on a database; ``"default"`` in memory."""
        return "default"

    def counts(self) -> QueueCounts:
        """This queue's jobs by state, now: ready, running, parked, dead, and how long the oldest ready one waits."""
        raise NotImplementedError(f"{type(self).__name__} does not count its jobs")

    def join(self, timeout: float | None = None) -> bool:
        """Block until no job is pending (True) or ``timeout`` seconds pass (False)."""
        return self._store.wait_empty(timeout)

    def on_dead_letter(self, callback: C) -> C:
        """Call ``callback(dead_letter)`` for each job that will not run again; usable as a decorator."""
        self._dead_letters.add(callback)
        return callback

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()


def shutdown_in_turn(queues: Iterable[StoreQueue]) -> None:
    """Shut ``queues`` down one after another, from this thread, each with its grace.

    Every queue stops claiming first, so none takes a new job while another
    drains. No thread is started: what stops workers while the interpreter
    exits (which refuses new threads since Python 3.12) can use it.
    """
    queues = list(queues)
    for queue in queues:
        queue.stop_claiming()
    for queue in queues:
        queue.shutdown()


def _check_grace(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{what} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def new_envelope(registry: Registry, job: Job, priority: int | None = None) -> Envelope:
    """Check ``job`` and wrap it for a store; ``QueueError`` naming the job if it cannot be dispatched."""
    job_cls = registry.check_dispatchable(job)
    if priority is None:
        priority = job_cls.PRIORITY
    else:
        try:
            check_priority(priority, "priority")
        except TypeError as exc:
            raise QueueError(f"job {job_cls.NAME!r}: {exc}") from None
    if priority == DEFAULT_PRIORITY:
        return envelope_kind(job_cls.NAME, job_cls.MAX_ATTEMPTS)(new_job_id(), encode(job), 0, carried_context())
    return PrioritizedEnvelope(
        new_job_id(), job_cls.NAME, encode(job), job_cls.MAX_ATTEMPTS, context=carried_context(), priority=priority
    )


def limit_key(job: Job, scope: str) -> LimitKey | None:
    """The limit key of a job whose class declares ``LIMIT``, in ``scope``; ``QueueError`` naming the job if none."""
    limit = type(job).LIMIT
    return None if limit is None else limit.key_of(type(job).NAME, job.unique_values(), scope)


def unique_key(job: Job, scope: str) -> UniqueKey | None:
    """The key of a job whose class declares ``UNIQUE``, in ``scope``; ``QueueError`` naming the job if none."""
    unique = type(job).UNIQUE
    return None if unique is None else unique.key_of(type(job).NAME, job.unique_values(), scope)


def delay_seconds(name: str, delay: Delay, run_at: datetime.datetime | None = None) -> float:
    """Seconds to hold a job back, from ``delay`` or ``run_at`` (at most one); ``QueueError`` naming the job."""
    if run_at is not None:
        if delay is not None:
            raise QueueError(f"job {name!r}: give delay or run_at, not both")
        return _seconds_until(name, run_at)
    if delay is None:
        return 0.0
    if isinstance(delay, datetime.timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        try:
            seconds = float(delay)
        except OverflowError:  # an int beyond any float (too long to quote, maybe)
            raise QueueError(f"job {name!r}: delay must be a finite number of seconds, got an int too large") from None
    else:
        raise QueueError(f"job {name!r}: delay must be seconds or a timedelta, got {type(delay).__name__}")
    if not 0 <= seconds < math.inf:
        raise QueueError(f"job {name!r}: delay must be >= 0 and finite, got {delay!r}")
    return seconds


def _seconds_until(name: str, run_at: datetime.datetime) -> float:
    """Seconds from now to the aware ``run_at``; 0 for a moment past (the job is due)."""
    if not isinstance(run_at, datetime.datetime):
        raise QueueError(f"job {name!r}: run_at must be an aware datetime, got {type(run_at).__name__}")
    if run_at.utcoffset() is None:
        # A naive datetime could mean the server's local time or UTC: which
        # one differs by hours, so the caller must say.
        raise QueueError(
            f"job {name!r}: run_at {run_at.isoformat()} is naive; give it a time zone "
            "(datetime.now(timezone.utc), or django.utils.timezone.now() in Django)"
        )
    return max(0.0, (run_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds())
