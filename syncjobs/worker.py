"""The worker loop, written once for every backend.

A backend is a *store* (see :class:`Store`): it keeps envelopes and knows how
to hand one out, finish it, park it for later, dead-letter it and take it
back.  Everything else, running the job in its context, deciding the outcome,
retries, dead letters and shutdown, lives here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor  # at import, not lazily: see exit_hooks.before_threads_join
from contextlib import AbstractContextManager
from traceback import format_exception
from typing import NamedTuple, cast

from .context import RunInfo, current_run
from .dead_letters import DeadLetterHandlers
from .envelope import Envelope
from .errors import Cancelled, Fatal, QueueError, Retryable
from .hooks import already_given
from .job import Job
from .payload import dead_letter_from_text, decode, encode_result
from .protocols import Store
from .registry import Registry
from .retry import retry_backoff
from .status import DEFAULT_KEEP_RESULT
from .timers import TimerHeap

logger = logging.getLogger("syncjobs")
#: Where the per-run lines go: the worker commands and embedded workers log the same line.
run_logger = logging.getLogger("syncjobs.worker")

# How long shutdown waits, past the grace, for idle workers to take their
# wake-up and leave; they need microseconds, so this is only a backstop.
_IDLE_EXIT_BOUND = 1.0
#: What popping a run that is no longer in ``WorkerPool._running`` returns.
_GONE = object()
#: Deadlines waiting before those of finished runs are pruned, at least.
_PRUNE_AT_LEAST = 1024
#: Who decides whether a run begins (see ``_Run.decide``).
_WORKER = object()
_SHUTDOWN = object()


class Outcome(enum.Enum):
    DONE = "done"
    RETRY = "retry"
    DEAD = "dead"
    ABORTED = "aborted"
    CANCELLED = "cancelled"
    #: No class is registered here for the job's NAME: handed back unrun, attempt unspent, for a worker that knows it.
    DEFERRED = "deferred"


#: Seconds a job whose NAME this worker has no class for waits for a worker that knows it, from when this one
#: first met it (a rolling deploy: an old worker meets a new job), before it is a dead letter; a database queue's.
DEFAULT_UNKNOWN_JOB_WAIT = 600.0
#: The longest such a job is handed back for before it is looked at again (a tenth of the wait, if less).
UNKNOWN_LOOK_EVERY = 10.0
#: Deferred jobs remembered before those met long ago (taken by another worker, likely) are forgotten.
_FORGET_UNKNOWN_AT = 10_000


# Not frozen: a frozen dataclass sets each field through object.__setattr__, which cost 1.5 µs a run (8% of
# an in-memory job) wherever an observer is attached (every ``syncjobs worker``, metrics). Read it; don't change it.
@dataclasses.dataclass(slots=True, unsafe_hash=True)
class RunReport:
    """What became of one run, for observers such as the ``syncjobs worker`` log line."""

    name: str
    id: str
    #: The run's number, from 1.
    attempt: int
    max_attempts: int
    #: Seconds the run took (until shutdown handed it back, for ``aborted``).
    duration: float
    outcome: Outcome
    #: Why it failed; empty for ``done``.
    error: str = ""
    #: Seconds until the retry, for ``retry``.
    retry_in: float | None = None


RunObserver = Callable[[RunReport], object]
#: Called before each run; the context manager it returns is entered around the run.
RunWrapper = Callable[[], AbstractContextManager[object]]


class _Run:
    """One run in progress; ``abandoned`` once shutdown or its timeout has taken its outcome away."""

    __slots__ = (
        "_deciders",
        "abandoned",
        "cancelled_by_user",
        "context",
        "envelope",
        "generation",
        "info",
        "job",
        "started",
        "timeout",
    )

    def __init__(self, envelope: Envelope, generation: _Generation, store: Store) -> None:
        self.generation = generation
        self.started = time.perf_counter()
        self.envelope = envelope
        # Reports go straight to the store: a callback bound to this run would make a reference cycle (run,
        # info, callback) that only the garbage collector frees, which then collected some 9 objects a job.
        self.info = RunInfo(
            envelope.id, envelope.name, envelope.attempt, envelope.max_attempts, store.progress, envelope
        )
        #: cancel() asked for this job: the run ends cancelled, whatever it does.
        self.cancelled_by_user = False
        # A fresh copy per run: one Context cannot be entered by two threads
        # at once, and what the job sets must not leak into its next run.
        self.context = envelope.context.copy()
        self.abandoned = False
        self._deciders: list[object] = []
        #: The job being run, once rebuilt from its payload; its timeout, once it has one.
        self.job: Job | None = None
        self.timeout: float | None = None

    def abandon(self) -> None:
        """Shutdown or the run's timeout took its outcome: what it reports from now on no longer belongs to the job."""
        self.abandoned = True
        self.info.stop_reports()

    def progress_json(self) -> str | None:
        """What the run last reported, as JSON, for the job's record when it ends."""
        progress = self.info.latest_progress
        return None if progress is None else progress.to_json()

    def decide(self, by: object) -> bool:
        """Whether ``by`` is the first to decide if this run begins: the worker, or shutdown before it.

        ``list.append`` is atomic, so the worker and shutdown agree on who
        came first without a lock.
        """
        self._deciders.append(by)
        return self._deciders[0] is by


class _Ended(NamedTuple):
    """How a run ended: its outcome, the error, the job it ran, what it raised, what it returned."""

    outcome: Outcome
    error: str
    job: Job | None = None
    exc: BaseException | None = None
    result: object = None


class _Slot:
    """What one worker thread is running, so that shutdown can tell idle workers from stuck ones."""

    __slots__ = ("run", "thread")

    def __init__(self) -> None:
        self.run: _Run | None = None
        self.thread: threading.Thread | None = None


@dataclasses.dataclass(eq=False)
class _Generation:
    """The workers of one ``start()``; a later ``start()`` never reuses them."""

    stopping: threading.Event
    executor: ThreadPoolExecutor | None = None
    #: Every worker's slot and future; a spare (see ``WorkerPool._timed_out``) is added under the pool's lock.
    workers: list[tuple[_Slot, concurrent.futures.Future[None]]] = dataclasses.field(default_factory=list)
    #: Spare workers that could not start (out of threads): each worker tries again after its runs.
    spares_owed: int = 0
    #: Held workers claim nothing until it is set: by ``release()``, or by the shutdown.
    hold: threading.Event | None = None


class RunLimit:
    """At most ``runs`` runs begin, counted as they are claimed, across every pool that shares it.

    ``on_reached`` is called once, on the worker thread that claimed the
    last allowed run, before that run begins (outside any pool lock).
    """

    def __init__(self, runs: int, on_reached: Callable[[], object]) -> None:
        self._left = runs
        self._lock = threading.Lock()
        self._on_reached = on_reached

    def take(self) -> int | None:
        """One run more: how many are left after it, or None when none is."""
        with self._lock:
            if self._left <= 0:
                return None
            self._left -= 1
            return self._left

    def reached(self) -> None:
        self._on_reached()


class WorkerPool:
    """``workers`` threads of a ``ThreadPoolExecutor``, each looping on the store."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        dead_letters: DeadLetterHandlers,
        *,
        workers: int,
        clock: Callable[[], float],
        timeout: float | None = None,
        keep_result: float = DEFAULT_KEEP_RESULT,
    ) -> None:
        self._store = store
        self._registry = registry
        self._dead_letters = dead_letters
        self._workers = workers
        self._clock = clock
        # Guards start, stop and shutdown against each other; workers never
        # take it. A run's outcome is applied by whichever of the worker or
        # shutdown pops it from _running (dict.pop is atomic).
        # Re-entrant: a signal handler that calls shutdown() while start() holds it must not deadlock.
        self._lock = threading.RLock()
        self._running: dict[_Run, None] = {}
        #: (id, lease) of runs cancel() asked for that were not found running here (yet): see cancel_run().
        self._cancel_ids: set[tuple[str, str | None]] = set()
        self._generation: _Generation | None = None
        # A tuple, replaced whole when one is added: each run reads it without a copy.
        self._observers: tuple[RunObserver, ...] = ()
        self._wrappers: list[RunWrapper] = []
        self._limit: RunLimit | None = None
        # end_grace(): set to cut a shutdown's grace short; _shutdown_wake
        # wakes the shutdown that waits out the grace.
        self._grace_cut = threading.Event()
        self._shutdown_wake: threading.Event | None = None
        #: Seconds a run of a job without a TIMEOUT of its own may take (checked by the queue); None: no limit.
        self.timeout = timeout
        #: Seconds a finished job's record is kept, for a job without a KEEP_RESULT of its own.
        self.keep_result = keep_result
        #: Seconds a job of a NAME with no class here is handed back for others, from first met; 0: dead at once.
        self.unknown_job_wait = 0.0
        #: When (pool clock) this worker first met each job it deferred so, by id.
        self._unknown_since: dict[str, float] = {}
        # The deadlines of runs with a timeout, on the pool's clock; their
        # thread starts with the first such run. A run that finishes in time
        # leaves its entry behind (a heap cannot drop one cheaply): at its
        # deadline it is not found among the running ones, and entries of
        # finished runs are pruned in one pass once they outnumber the rest.
        self._deadlines: TimerHeap[_Run] = TimerHeap(self._timed_out, clock=clock, name="syncjobs-deadlines")
        self._prune_deadlines_at = _PRUNE_AT_LEAST

    @property
    def started(self) -> bool:
        return self._generation is not None

    def observe(self, observer: RunObserver) -> None:
        """Call ``observer(report)`` after every run, on the worker's thread; it must be quick. Once, if given twice."""
        if not already_given(self._observers, observer):
            self._observers = (*self._observers, observer)

    def threads(self) -> list[threading.Thread]:
        """The threads of the running workers (those whose loop has begun)."""
        generation = self._generation
        if generation is None:
            return []
        return [slot.thread for slot, future in generation.workers if slot.thread is not None and not future.done()]

    def busy(self) -> bool:
        """Whether a worker has taken a job and not yet applied and reported its run (stuck runs timed out aside)."""
        return self.running() > 0

    def running(self) -> int:
        """How many workers have taken a job and not yet applied and reported its run (stuck runs timed out aside)."""
        generation = self._generation
        if generation is None:
            return 0
        return sum(1 for slot, _ in list(generation.workers) if slot.run is not None and not slot.run.abandoned)

    def stop_claiming(self) -> None:
        """Take no new job; runs in progress go on, and ``shutdown()`` still ends the workers."""
        with self._lock:
            generation = self._generation
            if generation is None:
                return
            generation.stopping.set()
        self._store.wake(len(generation.workers))

    def limit(self, limit: RunLimit) -> None:
        """Begin runs only while ``limit`` allows; a worker it refuses hands its job back and stops."""
        self._limit = limit

    def wrap(self, wrapper: RunWrapper) -> None:
        """Enter ``wrapper()`` around every run, in the worker thread and the job's context; once, if given twice."""
        if not already_given(self._wrappers, wrapper):  # twins share their wrappers, and each may be given it
            self._wrappers.append(wrapper)

    def share_jobs_of(self, other: WorkerPool) -> None:
        """Run ``other``'s job classes, inside its run wrappers, with its dead-letter callbacks (shared, not copied)."""
        self._registry = other._registry
        self._dead_letters = other._dead_letters
        self._wrappers = other._wrappers

    def end_grace(self) -> None:
        """Cut a shutdown's grace short (now, or when it starts): running jobs are handed back at once."""
        self._grace_cut.set()
        wake = self._shutdown_wake
        if wake is not None:
            wake.set()

    def start(self, *, held: bool = False) -> None:
        """Start the workers; ``held``, they claim nothing until :meth:`release` (or the shutdown)."""
        if self._generation is not None:
            return
        self._grace_cut.clear()
        generation = _Generation(threading.Event(), hold=threading.Event() if held else None)
        # Under the lock: a run that times out at once adds its spare only
        # once every worker is listed, and a shutdown finds them all.
        with self._lock:
            # Published before the first worker runs: a job that finishes at
            # once (and an observer calling stop_claiming() from it) must find it.
            self._generation = generation
            if self._workers:
                executor = ThreadPoolExecutor(self._workers, thread_name_prefix="syncjobs-worker")
                generation.executor = executor
                for _ in range(self._workers):
                    self._add_worker(generation, executor)

    def _add_worker(self, generation: _Generation, executor: ThreadPoolExecutor) -> None:
        slot = _Slot()
        future = executor.submit(self._loop, generation, slot)
        generation.workers.append((slot, future))
        future.add_done_callback(_report_crash)

    def release(self) -> None:
        """Let workers started held take jobs; a no-op otherwise."""
        generation = self._generation
        if generation is not None and generation.hold is not None:
            generation.hold.set()

    def settle_timers(self, timeout: float = 5.0) -> bool:
        """Wait until every run whose deadline the clock has passed is timed out (for tests that move the clock)."""
        return self._deadlines.settle(timeout)

    def shutdown(self, grace: float) -> int:
        """Stop claiming, give running jobs ``grace`` seconds in all, then hand back the rest; returns how many."""
        generation = self._generation
        if generation is None:
            return 0
        deadline = time.monotonic() + grace
        with self._lock:
            generation.stopping.set()
            self._generation = None
            # No worker is added once stopping is set (see _timed_out).
            workers = list(generation.workers)
        if generation.hold is not None:
            generation.hold.set()  # held workers go on, to see that they are stopping
        self._store.wake(len(workers))
        # One deadline shared by all workers, not grace per worker.
        self._wait_for_workers(workers, deadline)
        # No run times out from here on: a spare that one timed out just now is listed below.
        self._deadlines.stop()
        with self._lock:
            taken = [run for run in list(self._running) if self._running.pop(run, _GONE) is not _GONE]
            for run in taken:
                self._took(run)
            # A run its worker had not begun yet is handed back as it is.
            unbegun = [run for run in taken if run.decide(_SHUTDOWN)]
            stranded = [run for run in taken if run not in unbegun]
            for run in stranded:
                run.abandon()
            # Read again: spares that fail runs timed out meanwhile are waited for too.
            workers = list(generation.workers)
            # Under the lock, each slot read once: a worker finishing its run
            # clears slot.run at any moment.
            stuck = {id(slot) for slot, _ in workers if _abandoned(slot.run)}
        # Idle workers may not have taken their wake-up yet (with a grace of
        # 0, say); they leave within microseconds. Waiting for them means no
        # worker of this generation stays blocked on the store to take a wake-up
        # or a job meant for the next start(); only workers stuck in an
        # abandoned run are left behind, and those never claim again.
        idle = [future for slot, future in workers if id(slot) not in stuck]
        # What is left of the grace, for a spare writing a timed-out run's failure.
        concurrent.futures.wait(idle, timeout=max(_IDLE_EXIT_BOUND, deadline - time.monotonic()))
        try:
            for run in unbegun:
                if run.cancelled_by_user:
                    self._cancel(run, ran=False)
                else:
                    self._store.release(run.envelope)
            for run in stranded:
                run.info.cancel()
                if run.cancelled_by_user:
                    self._cancel(run, ran=run.job is not None)
                    self._report(run, Outcome.CANCELLED)
                    continue
                envelope = run.envelope
                logger.warning(
                    "job %s (%s) still running %s: cancelled and handed back",
                    envelope.name,
                    envelope.id,
                    "when a second signal cut the shutdown grace short"
                    if self._grace_cut.is_set()
                    else f"after the shutdown grace of {grace:.1f}s",
                    extra=_extra(envelope),
                )
                self._report(run, self._hand_back(envelope, "aborted at shutdown"), "handed back at shutdown")
        finally:
            self._deadlines.stop()
            # Threads stuck in a job that ignores its cancel token are left
            # behind; the next start() builds fresh executors.
            if generation.executor is not None:
                generation.executor.shutdown(wait=False)
        return len(stranded)

    def _wait_for_workers(self, workers: list[tuple[_Slot, concurrent.futures.Future[None]]], deadline: float) -> None:
        """Until every worker has left (or is stuck in a run timed out), the deadline passes, or end_grace()."""
        wake = threading.Event()
        self._shutdown_wake = wake
        try:
            for _, future in workers:
                future.add_done_callback(lambda _: wake.set())
            while True:
                wake.clear()  # before the checks: a set() after them still ends the wait
                remaining = deadline - time.monotonic()
                if (
                    self._grace_cut.is_set()
                    or remaining <= 0
                    or all(future.done() or _abandoned(slot.run) for slot, future in workers)
                ):
                    return
                wake.wait(remaining)
        finally:
            self._shutdown_wake = None

    def _report(self, run: _Run, outcome: Outcome, error: str = "", retry_in: float | None = None) -> None:
        if not self._observers:
            return
        envelope = run.envelope
        report = RunReport(
            envelope.name,
            envelope.id,
            run.info.attempt + 1,
            envelope.max_attempts,
            time.perf_counter() - run.started,
            outcome,
            error,
            retry_in,
        )
        for observer in self._observers:
            try:
                observer(report)
            except Exception:  # an observer's bug must not stop a worker
                logger.exception("run observer %r failed", observer)

    # -- the loop ---------------------------------------------------------

    def _loop(self, generation: _Generation, slot: _Slot) -> None:
        slot.thread = threading.current_thread()
        store = self._store
        stopping = generation.stopping
        if generation.hold is not None:
            generation.hold.wait()
        while not stopping.is_set():
            envelope = store.claim(stopping)
            if envelope is None:
                continue
            run = _Run(envelope, generation, store)
            slot.run = run
            if not self._admit(run, stopping):
                slot.run = None
                return
            try:
                applied = self._apply(run, self._execute(run))
            finally:
                slot.run = None
            if not applied:
                # Shutdown or the run's timeout took it: after a timeout, a
                # spare worker serves in this one's place, unless none could
                # start: then this one, now free, serves again.
                if generation.spares_owed and self._serve_as_owed_spare(generation):
                    continue
                return
            if generation.spares_owed:
                self._repay_spares(generation)

    def _admit(self, run: _Run, stopping: threading.Event) -> bool:
        """Begin ``run`` unless shutdown has begun or the limit is reached; a run not begun is handed back unspent.

        No lock: one shared by every worker, taken once a job, formed lock
        convoys under the GIL that halved throughput in some runs. Instead
        the run is published before ``stopping`` is read, and shutdown sets
        ``stopping`` before it reads the runs, so one of them sees the other;
        where both do, ``decide()`` settles which hands the job back.
        """
        self._running[run] = None
        # After publishing the run, as cancel_run() adds the id before it looks: one of them sees the other.
        if self._cancel_ids and _cancel_key(run.envelope) in self._cancel_ids:
            run.cancelled_by_user = True
        limit = self._limit
        # Separate lines, so that a test can stop a worker between the read and the decision.
        if not stopping.is_set():
            # Taken once stopping is read unset: a run the limit allows then
            # begins, unless shutdown takes it first (and a run that comes to
            # the limit's stop_claiming() counts it as begun).
            left = None if limit is None else limit.take()
            if (limit is None or left is not None) and run.decide(_WORKER):
                if limit is not None and left == 0:
                    limit.reached()  # this run is the last one the limit allows
                return True
        if self._running.pop(run, _GONE) is not _GONE:
            self._took(run)
            if run.cancelled_by_user:
                self._cancel(run, ran=False)
            else:
                self._store.release(run.envelope)
        # Otherwise shutdown took the run first, and hands it back.
        return False

    def _execute(self, run: _Run) -> _Ended:
        """How the run ended."""
        envelope = run.envelope
        if run.cancelled_by_user:  # cancelled before it began: it does not run
            return tuple.__new__(_Ended, (Outcome.CANCELLED, "cancelled", None, None, None))
        job_cls = self._registry.get(envelope.name)
        if job_cls is None:
            return self._unknown(envelope)
        # Decoded afresh for each run, so that a retry never sees what a run changed.
        try:
            job = run.context.run(job_cls.from_payload, decode(envelope.payload))
        except BaseException as exc:  # noqa: BLE001 - whatever from_payload raises, the job cannot run
            error = f"cannot be run: payload does not fit {envelope.name!r}: {_describe(exc)}"
            return _Ended(Outcome.DEAD, error, exc=exc)
        run.job = job
        timeout = job_cls.TIMEOUT if job_cls.TIMEOUT is not None else self.timeout
        if timeout is not None and not run.generation.stopping.is_set():
            self._watch(run, timeout)
        try:
            value = run.context.run(_invoke, job, run.info, self._wrappers)
        except Cancelled:
            return _Ended(Outcome.ABORTED, "cancelled", job)
        except Fatal as exc:
            return _Ended(Outcome.DEAD, str(exc), job)
        except Retryable as exc:
            return _Ended(Outcome.RETRY, str(exc), job)
        except BaseException as exc:  # noqa: BLE001 - any failure of user code is a failed run; the worker survives
            # The traceback goes to the log; the dead letter keeps the one-line reason.
            return _Ended(Outcome.RETRY, f"job raised {_describe(exc)}", job, exc)
        # tuple.__new__ straight from C: a NamedTuple's own __new__ is Python,
        # and a no-op run pays for every step of its way through the loop.
        return tuple.__new__(_Ended, (Outcome.DONE, "", job, None, value))

    def _unknown(self, envelope: Envelope) -> _Ended:
        """A job whose NAME has no class here: deferred for a worker that knows it, for ``unknown_job_wait``.

        Counted from when this worker first met it, on its own clock: not from
        the dispatch, which may be long before the job came due (a delay, a
        retry, a dead letter retried), nor on another machine's clock.
        """
        error = f"cannot be run: no job class is registered as {envelope.name!r}"
        wait = self.unknown_job_wait
        if wait <= 0:
            return _Ended(Outcome.DEAD, error)
        now = self._clock()
        first = self._unknown_since.setdefault(envelope.id, now)
        left = first + wait - now
        if left <= 0:
            self._unknown_since.pop(envelope.id, None)
            return _Ended(Outcome.DEAD, f"{error}, and no worker that has one took it within {wait:g}s")
        if len(self._unknown_since) > _FORGET_UNKNOWN_AT:
            # Jobs another worker took meanwhile are not seen again here: forget the long gone.
            self._unknown_since = {k: t for k, t in self._unknown_since.items() if now - t <= 2 * wait}
        return _Ended(Outcome.DEFERRED, error, result=min(UNKNOWN_LOOK_EVERY, wait / 10, left))

    def _watch(self, run: _Run, timeout: float) -> None:
        """Time ``run`` out ``timeout`` seconds from now."""
        run.timeout = timeout
        self._deadlines.start()  # a no-op once it runs
        waiting = self._deadlines.push(self._clock() + timeout, run)
        if waiting > self._prune_deadlines_at:
            waiting = self._deadlines.prune(lambda entry: entry in self._running)
            self._prune_deadlines_at = max(_PRUNE_AT_LEAST, 2 * waiting)

    def _timed_out(self, run: _Run) -> None:
        """On the deadline thread: a run past its timeout is cancelled and a spare worker takes its place.

        Taking the run from ``_running`` takes its outcome from its worker:
        whatever the job does later (it may ignore its token for ever) is
        void, and that worker leaves once the job returns. The spare first
        applies the failure by the usual rules (a retry or a dead letter: user
        code and store writes, kept off this thread, which serves every other
        deadline), then serves, so the pool keeps its width.
        """
        if self._running.pop(run, _GONE) is _GONE:
            return  # finished in time, or shutdown took it
        self._took(run)
        run.abandon()
        run.info.cancel()
        envelope = run.envelope
        logger.warning(
            "job %s (%s) timed out after %gs: cancelled, and whatever it does from now on is ignored",
            envelope.name,
            envelope.id,
            run.timeout,
            extra=_extra(envelope),
        )
        # The spare applies the failure even during a shutdown (its loop then
        # ends at once): this thread runs no user code and never blocks on the store.
        with self._lock:
            generation = run.generation
            added = self._add_spare(generation, run)
        # Once the spare is listed: a shutdown waiting for this worker no longer does, and waits for the spare.
        wake = self._shutdown_wake
        if wake is not None:
            wake.set()
        if added:
            return
        with self._lock:
            if generation is self._generation and not generation.stopping.is_set():
                generation.spares_owed += 1
                logger.error(
                    "no spare worker could start for the timed-out job %s: the pool serves one worker short "
                    "until one can",
                    envelope.id,
                    extra=_extra(envelope),
                )
        self._fail_timed_out(run)  # the last resort: here, as no other thread could

    def _serve_as_owed_spare(self, generation: _Generation) -> bool:
        """A worker freed from a timed-out run takes the place of a spare that could not start."""
        with self._lock:
            if not generation.spares_owed or generation is not self._generation or generation.stopping.is_set():
                return False
            generation.spares_owed -= 1
            return True

    def _repay_spares(self, generation: _Generation) -> None:
        """Start the spare workers that could not start earlier, while the pool is current."""
        with self._lock:
            while generation.spares_owed and generation is self._generation and not generation.stopping.is_set():
                if not self._add_spare(generation, None):
                    return
                generation.spares_owed -= 1
                if not generation.spares_owed:
                    logger.info("the worker pool serves at its full width again")

    def _add_spare(self, generation: _Generation, timed_out: _Run | None) -> bool:
        """Start a worker that fails ``timed_out`` (if any), then serves; under ``_lock``. False if it cannot start."""
        slot = _Slot()
        future: concurrent.futures.Future[None] = concurrent.futures.Future()

        def serve() -> None:
            future.set_running_or_notify_cancel()
            try:
                slot.thread = threading.current_thread()
                if timed_out is not None:
                    self._fail_timed_out(timed_out)
                self._loop(generation, slot)
            except BaseException as exc:  # noqa: BLE001 - a crash of the loop, reported by _report_crash
                future.set_exception(exc)
            else:
                future.set_result(None)

        # Not a daemon, like the executor's threads: the exit hook stops it.
        thread = threading.Thread(target=serve, name="syncjobs-worker-spare")
        try:
            thread.start()
        except RuntimeError:  # the interpreter is exiting, or out of threads
            return False
        future.add_done_callback(_report_crash)
        # Workers that have left (those freed from a timed-out run) are dropped here.
        generation.workers = [worker for worker in generation.workers if not worker[1].done()]
        generation.workers.append((slot, future))
        return True

    def _fail_timed_out(self, run: _Run) -> None:
        if run.cancelled_by_user:
            self._cancel(run, ran=True)
            self._report(run, Outcome.CANCELLED)
            return
        error = f"timed out after {run.timeout:g}s"
        retry_in = self._retry(run, error, run.job, None)
        self._report(run, Outcome.RETRY if retry_in is not None else Outcome.DEAD, error, retry_in)

    def _apply(self, run: _Run, ended: _Ended) -> bool:
        """Apply the run's outcome; False if shutdown or its timeout took the run first (the outcome is void)."""
        outcome, error, job, exc = ended.outcome, ended.error, ended.job, ended.exc
        envelope = run.envelope
        if self._running.pop(run, _GONE) is _GONE:
            logger.debug(
                "late finish of abandoned job %s (%s) ignored", envelope.name, envelope.id, extra=_extra(envelope)
            )
            return False
        if self._cancel_ids:
            self._took(run)
        if run.cancelled_by_user:
            self._cancel(run, ran=job is not None)
            self._report(run, Outcome.CANCELLED)
            return True
        retry_in = None
        if outcome is Outcome.DONE:
            keep = None if job is None else job.KEEP_RESULT
            keep = float(self.keep_result if keep is None else keep)
            result = None if keep <= 0 or ended.result is None else self._kept_result(envelope, ended.result)
            self._store.complete(
                envelope, result, keep, None if run.info.latest_progress is None else run.progress_json()
            )
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("job %s (%s) done", envelope.name, envelope.id, extra=_extra(envelope))
            if not self._observers:  # most pools: no report to make
                return True
        elif outcome is Outcome.ABORTED:
            outcome = self._hand_back(envelope, "cancelled")
        elif outcome is Outcome.DEFERRED:
            retry_in = cast(float, ended.result)  # the wait, from _unknown()
            self._store.park(envelope, self._clock() + retry_in)
            logger.info(
                "job %s (%s): %s here; handed back unrun for a worker that knows it, looking again in %.3gs",
                envelope.name,
                envelope.id,
                error.removeprefix("cannot be run: "),
                retry_in,
                extra={**_extra(envelope), "outcome": outcome.value},
            )
        elif outcome is Outcome.DEAD:
            if job is not None:  # a run happened and is spent
                envelope.attempt += 1
            self._dead(envelope, error, exc)
        else:
            retry_in = self._retry(run, error, job, exc)
            if retry_in is None:
                outcome = Outcome.DEAD
        self._report(run, outcome, error, retry_in)
        return True

    def _retry(
        self,
        run: _Run,
        error: str,
        job: Job | None,
        exc: BaseException | None,
    ) -> float | None:
        """Park the job for its next run; returns the wait, or None when it became a dead letter.

        ``retry_wait()`` runs in a fresh copy of the dispatcher's context: not
        in the run's, which the run left its job in (see ``_invoke``), and
        which a timed-out run's thread may still be inside.
        """
        envelope = run.envelope
        failed = envelope.attempt
        envelope.attempt += 1
        if envelope.attempt >= envelope.max_attempts:
            self._dead(envelope, error, exc)
            return None
        wait = retry_backoff(failed) if job is None else _retry_wait(job, failed, run, envelope.context.copy())
        # INFO: a retry is the queue working as designed; the dead letter, if
        # it comes to that, is the WARNING or ERROR.
        logger.info(
            "job %s (%s) failed run %d of %d, retrying in %.3gs: %s",
            envelope.name,
            envelope.id,
            envelope.attempt,
            envelope.max_attempts,
            wait,
            error,
            exc_info=exc,
            extra=_extra(envelope, envelope.attempt),  # the run that failed, counted already
        )
        self._store.park(envelope, self._clock() + wait)
        return wait

    def _kept_result(self, envelope: Envelope, value: object) -> str | None:
        """What the run returned, as JSON to keep; None (and a WARNING) if it cannot be kept.

        Not a failure: the job's work is done, and running it again would
        return the same.
        """
        try:
            return encode_result(value)
        except QueueError as exc:
            logger.warning(
                "job %s (%s) is done, but its result is not kept: it %s",
                envelope.name,
                envelope.id,
                exc.message,
                extra=_extra(envelope),
            )
            return None

    def _took(self, run: _Run) -> None:
        """Whoever popped ``run`` from ``_running`` calls this: a cancel_run() too late to find it left its key."""
        if self._cancel_ids:
            key = _cancel_key(run.envelope)
            if key in self._cancel_ids:
                self._cancel_ids.discard(key)
                run.cancelled_by_user = True

    def cancel_run(self, job_id: str, lease: str | None = None, *, remember: bool = True) -> None:
        """cancel() asked for ``job_id``: a run of it here gets its token set and will end cancelled.

        With ``remember``, a run of it (under ``lease``, for a database row
        this process holds) not found here yet is remembered: when it begins,
        it ends cancelled without running, and when its outcome is applied,
        it ends cancelled whatever it was.
        """
        # The key first, then the look: _admit() publishes the run, then looks at the keys.
        if remember:
            self._cancel_ids.add((job_id, lease))
        for run in list(self._running):
            if run.envelope.id == job_id and (lease is None or _cancel_key(run.envelope)[1] == lease):
                run.cancelled_by_user = True
                run.info.cancel()

    def _cancel(self, run: _Run, *, ran: bool) -> None:
        """End a cancelled job: not retried, not a dead letter; a run that began is spent."""
        envelope = run.envelope
        self._cancel_ids.discard(_cancel_key(envelope))
        number = run.info.attempt + 1  # the run's, as its run line counts it, begun or not
        if ran:
            envelope.attempt += 1
        self._store.cancelled(envelope, run.progress_json())
        logger.info("job %s (%s) cancelled", envelope.name, envelope.id, extra=_extra(envelope, number))

    def _hand_back(self, envelope: Envelope, why: str) -> Outcome:
        """A run that did not finish: its attempt is spent, and it runs again unless that was the last."""
        envelope.attempt += 1
        if envelope.attempt >= envelope.max_attempts:
            self._dead(envelope, f"{why} on its last attempt ({envelope.attempt} of {envelope.max_attempts})")
            return Outcome.DEAD
        self._store.release(envelope)
        return Outcome.ABORTED

    def _dead(self, envelope: Envelope, error: str, exc: BaseException | None = None) -> None:
        # The store first, so pending_count() is already down when callbacks run.
        self._store.dead(envelope, error, _traceback_text(exc))
        dead = dead_letter_from_text(envelope.id, envelope.name, envelope.payload, envelope.attempt, error)
        self._dead_letters.emit(dead, envelope.context, exc)


#: The most of a traceback a dead job keeps (characters): its end, where the job raised.
TRACEBACK_KEPT = 16_000


def _traceback_text(exc: BaseException | None) -> str | None:
    """Where a dead job's last run raised, for its status and the dashboard (never logged by this)."""
    if exc is None:
        return None
    text = "".join(format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) <= TRACEBACK_KEPT else "…\n" + text[-TRACEBACK_KEPT:]


def _cancel_key(envelope: Envelope) -> tuple[str, str | None]:
    # A database claim's lease names the run: a later claim of the same row is another.
    return envelope.id, getattr(envelope, "lease", None)


def _abandoned(run: _Run | None) -> bool:
    return run is not None and run.abandoned


def log_run(report: RunReport) -> None:
    """The per-run INFO line (job, id, run N of M, time, outcome) on ``syncjobs.worker``; never the payload."""
    if report.outcome is Outcome.DEFERRED:
        return  # nothing ran: the pool's own INFO line says it was handed back, and why
    if report.outcome is Outcome.DONE:
        result = "done"
    elif report.outcome is Outcome.RETRY:
        result = f"failed, retry in {report.retry_in:.3g}s: {report.error}"
    elif report.outcome is Outcome.DEAD:
        result = f"dead: {report.error}"
    elif report.outcome is Outcome.CANCELLED:
        result = "cancelled"
    else:
        result = f"aborted: {report.error}"
    run_logger.info(
        "job %s (%s) run %d of %d in %.1fms: %s",
        report.name,
        report.id,
        report.attempt,
        report.max_attempts,
        report.duration * 1000,
        result,
        extra={
            "job_name": report.name,
            "job_id": report.id,
            "attempt": report.attempt,
            "duration": round(report.duration, 6),
            "outcome": report.outcome.value,
        },
    )


def _invoke(job: Job, info: RunInfo, wrappers: list[RunWrapper]) -> object:
    # Not reset after: this is the run's own context, which nothing enters once the run is over
    # (a reset cost a twentieth of a no-op run).
    current_run.set(info)
    if not wrappers:  # an ExitStack costs more than a no-op run
        return job.run()
    with contextlib.ExitStack() as around:
        for wrapper in wrappers:
            around.enter_context(wrapper())
        return job.run()


def _retry_wait(job: Job, failed: int, run: _Run, context: contextvars.Context) -> float:
    """The job's own wait, run in ``context``; the default backoff if that fails or makes no sense."""
    envelope = run.envelope
    try:
        wait = float(context.run(job.retry_wait, failed))
    except BaseException:  # user code: whatever it raises, the worker goes on
        logger.exception(
            "retry_wait() of job %s (%s) failed; using the default backoff",
            envelope.name,
            envelope.id,
            extra=_extra(envelope, failed + 1),
        )
        return retry_backoff(failed)
    if not 0 <= wait < float("inf"):
        logger.error(
            "retry_wait() of job %s (%s) returned %r; using the default backoff",
            envelope.name,
            envelope.id,
            wait,
            extra=_extra(envelope, failed + 1),
        )
        return retry_backoff(failed)
    return wait


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _extra(envelope: Envelope, run: int | None = None) -> dict[str, object]:
    """A log record's fields; ``attempt`` counts runs from 1, as the run lines do: the run the line is about.

    That is the run under way or next (``envelope.attempt + 1``) unless ``run`` says which.
    """
    return {"job_name": envelope.name, "job_id": envelope.id, "attempt": envelope.attempt + 1 if run is None else run}


def _report_crash(future: concurrent.futures.Future[None]) -> None:
    """A worker loop that dies is a bug in syncjobs: report it as an uncaught thread exception."""
    exc = future.exception() if not future.cancelled() else None
    if exc is None:
        return
    logger.critical("a syncjobs worker loop crashed", exc_info=exc)
    threading.excepthook(threading.ExceptHookArgs((type(exc), exc, exc.__traceback__, threading.current_thread())))
