"""The in-memory backend: one process, nothing persisted.

Ready envelopes wait in one :class:`~syncjobs.ready.ReadyQueue` that every
worker blocks on; retries and delayed jobs wait in a :class:`~syncjobs.timers.TimerHeap`
that moves them to the ready queue when due.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final, NamedTuple

from .envelope import Envelope, make_envelope
from .ids import created_at
from .limits import LimitKey, LimitRow
from .memory_limits import MemoryLimits
from .queue import DEFAULT_SHUTDOWN_GRACE, StoreQueue
from .ready import ReadyQueue
from .status import DEFAULT_KEEP_RESULT, JobStatus, Progress, QueueCounts, State, decode_result, utc
from .timers import TimerHeap
from .unique import UniqueKey

logger = logging.getLogger("syncjobs")


class _Record(NamedTuple):
    """A finished job, kept for ``status()`` until ``expires`` (on the store's clock)."""

    state: State
    name: str
    attempts: int
    max_attempts: int
    result: str | None
    error: str | None
    started: float | None
    finished: float
    expires: float
    progress: str | None
    payload: str | bytes
    priority: int
    traceback: str | None


# A record as kept: a plain tuple of the fields above, read through _Record. The garbage collector stops
# tracking a plain tuple that holds only strings and numbers once it has seen it; it tracks a NamedTuple for
# ever, and each collection of the oldest generation walked every kept record: some 3 µs a job in memory.
_Row = tuple[
    State, str, int, int, str | None, str | None, float | None, float, float, str | None, str | bytes, int, str | None
]
# Positions in a row of the fields read without a _Record; literals, which mypy types the fields by.
_STATE: Final = 0
_FINISHED: Final = 7
_EXPIRES: Final = 8


#: The most finished jobs' records an in-memory queue keeps: beyond it, those
#: soonest to expire go first. About 280 bytes each, plus the result and the
#: payload (the envelope's, kept as it is): some 30 MB for small ones, whatever
#: the rate of jobs and their keep_result.
MAX_RECORDS = 100_000

#: The most of a dead job's traceback a record keeps (characters; a database keeps more).
TRACEBACK_KEPT = 2_000

#: Seconds (store clock) between prunes of the kept records at most, while jobs finish.
_PRUNE_EVERY = 1.0

#: Waiting jobs cancelled before the timers are pruned of the parked ones (or half the timers, if more).
_PRUNE_CANCELLED_AT = 1_000

#: In ``MemoryStore._started`` for a job cancelled while it waited: its claim drops it.
_CANCELLED = -1.0


#: Keys held before those no job holds any more are forgotten (then twice as many as are still held).
_UNIQUE_PRUNE_AT = 1_000


class _Holder(NamedTuple):
    """The job that took a unique key, how the key holds, and until when (store clock) for ``seconds=``."""

    job_id: str
    holds: str
    expires: float | None


def _json(progress: Progress | None) -> str | None:
    return None if progress is None else progress.to_json()


class MemoryStore:
    def __init__(self, clock: Callable[[], float], keep_dead: float) -> None:
        self._clock = clock
        #: Seconds a dead job's record is kept (a done job's keep comes with it).
        self.keep_dead = keep_dead
        self._ready = ReadyQueue()
        self.timers: TimerHeap[Envelope] = TimerHeap(self._ready.put, clock=clock)
        # Unfinished jobs by id: what pending() counts and status() finds.
        # A dict's set and pop are atomic, so neither the dispatcher nor a
        # worker takes a lock per job (a lock they shared formed lock convoys
        # under the GIL). About 38 bytes a pending job.
        self._unfinished: dict[str, Envelope] = {}
        # When (epoch seconds) the runs in progress began, by job id; or
        # _CANCELLED for a waiting job cancel() ended. setdefault() is atomic:
        # a claim and a cancel() agree on which came first without a lock.
        self._started: dict[str, float] = {}
        #: What running jobs last reported, by id.
        self._progress: dict[str, Progress] = {}
        # Finished jobs' records; and their ids in the order they expire, a deque for each keep (seconds) in
        # use: records kept as long expire in the order they are written. A deque of strings holds nothing the
        # collector tracks, and makes no tuple per job (a heap of (expiry, id) did). Few keeps are in use (one
        # per KEEP_RESULT), so a deque, once made, stays: a worker may be appending to it.
        self._records: dict[str, _Row] = {}
        self._expiry: dict[float, deque[str]] = {}
        #: When the soonest kept record expires (store clock), as last known: a finish from then on prunes.
        self._next_expiry = math.inf
        self._pruning = threading.Lock()
        self._idle = threading.Condition()
        #: Threads in wait_finished(), which wants every finish (wait_empty() only the last).
        self._finish_waiters = 0
        #: Waiting jobs cancel() ended since the timers were last pruned of them.
        self._cancelled_since_prune = 0
        # Unique jobs' keys (SHA-256 hex) and the jobs that took them.
        self._unique: dict[str, _Holder] = {}
        self._unique_lock = threading.Lock()
        self._unique_prune_at = _UNIQUE_PRUNE_AT
        #: Concurrency and rate limits: the limit key of a claimed job (None for most), and the permits.
        self._limit_of: Callable[[Envelope], LimitKey | None] | None = None
        self._limits = MemoryLimits(clock, self._ready.put, self.timers.push)

    def limit_with(self, limit_of: Callable[[Envelope], LimitKey | None], in_use: Callable[[], bool]) -> None:
        self._limit_of = limit_of

    def put(self, envelope: Envelope, delay: float, unique: UniqueKey | None = None) -> str | None:
        payload = envelope.payload
        if type(payload) is str and payload.isascii():
            # Held as bytes while it waits: a bytes object's header is smaller than a str's.
            envelope.payload = payload.encode()
        if unique is not None:
            return self._put_unique(envelope, delay, unique)
        self._unfinished[envelope.id] = envelope
        if delay > 0:
            self.timers.push(self._clock() + delay, envelope)
        else:
            self._ready.put(envelope)
        return None

    def _put_unique(self, envelope: Envelope, delay: float, unique: UniqueKey) -> str | None:
        # Under the lock every dispatch of a unique job takes: the check and the
        # put are one step, so two dispatchers of one key never both enqueue.
        with self._unique_lock:
            holder = self._unique.get(unique.digest)
            if holder is not None and self._holds(holder):
                return holder.job_id
            expires = None if unique.seconds is None else self._clock() + unique.seconds
            self._unique[unique.digest] = _Holder(envelope.id, unique.holds, expires)
            self.put(envelope, delay)
            if len(self._unique) >= self._unique_prune_at:
                self._prune_unique()
        return None

    def _holds(self, holder: _Holder) -> bool:
        """Whether the job ``holder`` names holds its key still (see ``syncjobs.Unique``)."""
        if holder.expires is not None:
            return self._clock() < holder.expires
        if holder.job_id not in self._unfinished:
            return False
        started = self._started.get(holder.job_id)
        if holder.holds == "queued":
            return started is None  # waiting, not running nor cancelled
        return started is not _CANCELLED

    def _prune_unique(self) -> None:
        """Forget the keys no job holds any more, once they are many; under ``_unique_lock``."""
        self._unique = {digest: holder for digest, holder in self._unique.items() if self._holds(holder)}
        self._unique_prune_at = max(_UNIQUE_PRUNE_AT, 2 * len(self._unique))

    def claim(self, stopping: threading.Event) -> Envelope | None:
        item = self._ready.get()
        # A stale wake-up from an earlier shutdown is harmless: the loop asks again.
        if item is None:
            return None
        now = time.time()
        job_id = item.id
        limit = None if self._limit_of is None else self._limit_of(item)
        if limit is not None and self._started.get(job_id) is not _CANCELLED and not self._limits.admit(item, limit):
            return None  # over its limit: it waits for a permit, or for its turn
        if self._started.setdefault(job_id, now) is not now:
            # cancel() ended it while it waited: it does not run; the loop asks again.
            self._started.pop(job_id, None)
            self._limits.ended(item)
            self._limits.dropped(item)
            return None
        return item

    def complete(self, envelope: Envelope, result: str | None, keep: float, progress: str | None = None) -> None:
        if keep > 0:
            started = self._started.get(envelope.id)
            self._keep(envelope, "done", keep, envelope.attempt + 1, started, progress=progress, result=result)
        self._limits.ended(envelope)
        self._finish(envelope)

    def cancelled(self, envelope: Envelope, progress: str | None) -> None:
        if self.keep_dead > 0:
            started = self._started.get(envelope.id)
            self._keep(envelope, "cancelled", self.keep_dead, envelope.attempt, started, progress=progress)
        self._limits.ended(envelope)
        self._finish(envelope)

    def progress(self, envelope: Envelope, progress: Progress) -> None:
        self._progress[envelope.id] = progress

    def cancel(self, job_id: str) -> str | None:
        envelope = self._unfinished.get(job_id)
        if envelope is None:
            return None
        if self._started.setdefault(job_id, _CANCELLED) is not _CANCELLED:
            return "requested"  # it runs: the pool sets its token
        if job_id not in self._unfinished:  # it finished meanwhile: nothing to cancel
            self._started.pop(job_id, None)
            return None
        # Waiting (ready or parked): its claim will drop it; it ends now.
        self._keep(envelope, "cancelled", self.keep_dead, envelope.attempt, None)
        self._unfinished.pop(job_id, None)
        if not self._unfinished or self._finish_waiters:
            self._notify_finish()
        self._cancelled_since_prune += 1
        if self._cancelled_since_prune >= max(_PRUNE_CANCELLED_AT, len(self.timers) // 2):
            self._prune_cancelled()
        return "ended"

    def _prune_cancelled(self) -> None:
        """Drop from the timers the parked jobs cancel() ended: a delay of days would hold them that long."""
        self._cancelled_since_prune = 0
        dropped: list[Envelope] = []

        def keep(envelope: Envelope) -> bool:
            if self._started.get(envelope.id) is _CANCELLED:
                dropped.append(envelope)
                return False
            return True

        self.timers.prune(keep)
        for envelope in dropped:  # what their claims would have done
            self._started.pop(envelope.id, None)
            self._limits.dropped(envelope)

    def dead(self, envelope: Envelope, error: str, traceback: str | None = None) -> None:
        if traceback is not None and len(traceback) > TRACEBACK_KEPT:
            # Its end, where the job raised: up to MAX_RECORDS dead ones may be kept, in this process's memory.
            traceback = "…\n" + traceback[-TRACEBACK_KEPT:]
        if self.keep_dead > 0:
            started = self._started.get(envelope.id)
            self._keep(envelope, "dead", self.keep_dead, envelope.attempt, started, error=error, traceback=traceback)
        self._limits.ended(envelope)
        self._finish(envelope)

    def park(self, envelope: Envelope, due: float) -> None:
        self._progress.pop(envelope.id, None)  # the next run reports its own
        self._started.pop(envelope.id, None)
        self._limits.ended(envelope)
        self.timers.push(due, envelope)

    def release(self, envelope: Envelope) -> None:
        self._progress.pop(envelope.id, None)
        self._started.pop(envelope.id, None)
        self._limits.ended(envelope)
        self._ready.put(envelope)

    def wake(self, count: int) -> None:
        for _ in range(count):
            self._ready.wake()

    def status(self, job_id: str) -> JobStatus | None:
        # Read in the order a job moves: its record is written before it
        # leaves _unfinished, so a job finishing meanwhile is found in one.
        envelope = self._unfinished.get(job_id)
        if envelope is None:
            return self._finished_status(job_id)
        started = self._started.get(job_id)
        run_at = None
        if started is _CANCELLED:  # ending as cancelled at this moment, unless it finished first
            finished = self._finished_status(job_id)
            if finished is not None or job_id not in self._unfinished:
                return finished
            return JobStatus(
                job_id,
                envelope.name,
                "cancelled",
                envelope.attempt,
                envelope.max_attempts,
                created_at=utc(created_at(job_id)),
                payload=decode_result(envelope.payload),
                priority=envelope.priority,
            )
        if started is not None:
            state: State = "running"
        else:
            run_at = self._due(envelope)
            state = "retrying" if envelope.attempt else "scheduled" if run_at is not None else "queued"
        return JobStatus(
            job_id,
            envelope.name,
            state,
            envelope.attempt,
            envelope.max_attempts,
            created_at=utc(created_at(job_id)),
            started_at=utc(started),
            run_at=utc(run_at),
            progress=self._progress.get(job_id) if started is not None else None,
            payload=decode_result(envelope.payload),
            priority=envelope.priority,
        )

    def _record(self, job_id: str) -> _Record | None:
        row = self._records.get(job_id)
        return None if row is None else _Record._make(row)

    def _finished_status(self, job_id: str) -> JobStatus | None:
        record = self._record(job_id)
        if record is None or record.expires <= self._clock():
            return None
        return JobStatus(
            job_id,
            record.name,
            record.state,
            record.attempts,
            record.max_attempts,
            error=record.error,
            result=decode_result(record.result),
            created_at=utc(created_at(job_id)),
            started_at=utc(record.started),
            finished_at=utc(record.finished),
            progress=Progress.from_json(record.progress),
            payload=decode_result(record.payload),
            priority=record.priority,
            traceback=record.traceback,
        )

    def _due(self, envelope: Envelope) -> float | None:
        """When a parked envelope is due, in epoch seconds; None if it is not parked."""
        due = self.timers.due_of(envelope)
        return None if due is None else time.time() + max(0.0, due - self._clock())

    def _keep(
        self,
        envelope: Envelope,
        state: State,
        keep: float,
        attempts: int,
        started: float | None,
        *,
        progress: str | None = None,
        result: str | None = None,
        error: str | None = None,
        traceback: str | None = None,
    ) -> None:
        """Write the finished job's record; ``progress`` None: what it reported last, if it did."""
        job_id = envelope.id
        if progress is None and self._progress:
            progress = _json(self._progress.get(job_id))
        now = self._clock()
        expires = now + keep
        self._records[job_id] = (
            state,
            envelope.name,
            attempts,
            envelope.max_attempts,
            result,
            error,
            started,
            time.time(),
            expires,
            progress,
            envelope.payload,
            envelope.priority,
            traceback,
        )
        ids = self._expiry.get(keep)
        if ids is None:
            ids = self._expiry.setdefault(keep, deque())
        ids.append(job_id)
        # Unlocked: a prune racing this may write a later time over it, no later than _PRUNE_EVERY from its
        # own: the first finish from then on prunes (status() reads each record's expiry itself meanwhile).
        if expires < self._next_expiry:  # noqa: PLR1730 - min() costs a tenth of what a no-op job's record does
            self._next_expiry = expires
        if self._next_expiry <= now or len(self._records) > MAX_RECORDS:
            self._prune(now)

    def _prune(self, now: float) -> None:
        """Forget the records past their keep, and the soonest to expire beyond MAX_RECORDS; one worker at a time."""
        if not self._pruning.acquire(blocking=False):
            return
        try:
            records = self._records
            while True:
                soonest, expires = self._soonest_to_expire()
                if soonest is None or (expires > now and len(records) <= MAX_RECORDS):
                    break
                records.pop(soonest.popleft(), None)
            self._next_expiry = min(expires, now + _PRUNE_EVERY)
        finally:
            self._pruning.release()

    def _forget_expiry(self, job_id: str) -> None:
        """Take ``job_id`` out of the expiry deques, where its record is gone and another may come; under _pruning.

        Left there, a record written later under the id (a dead letter
        retried, then dead again) would be met where the first was, and hold
        up the prune of every record behind it until it expires.
        """
        for ids in list(self._expiry.values()):
            try:
                ids.remove(job_id)
            except ValueError:
                continue
            return

    def _soonest_to_expire(self) -> tuple[deque[str] | None, float]:
        """The deque of ids whose first record expires soonest, and when; under ``_pruning``.

        Ids whose record is gone (purged, expired) are dropped on the way.
        """
        soonest: deque[str] | None = None
        expires = math.inf
        records = self._records
        for ids in list(self._expiry.values()):
            while ids:
                row = records.get(ids[0])
                if row is not None:
                    if row[_EXPIRES] < expires:
                        soonest, expires = ids, row[_EXPIRES]
                    break
                ids.popleft()
        return soonest, expires

    def unfinished_ids(self) -> set[str]:
        return set(self._unfinished)

    def limits(self, queue: str) -> list[LimitRow]:
        """The limit keys in use now, with their permits (see :meth:`MemoryLimits.in_use`)."""

        def name_of(job_id: str) -> str | None:
            envelope = self._unfinished.get(job_id)
            return None if envelope is None else envelope.name

        return self._limits.in_use(queue, name_of)

    def job_ids(self) -> list[str]:
        """The ids of the jobs this store knows now, newest first: unfinished ones and finished ones kept.

        Read without stopping the workers (each dict copied in one step, the
        unfinished first: a job finishing meanwhile is in one or both). A
        finished job's record past its keep may be listed until it is pruned:
        ``status()`` says None for it.
        """
        unfinished = list(self._unfinished)
        finished = list(self._records)
        # UUIDv7 ids sort by when they were made (to the millisecond).
        return sorted({*unfinished, *finished}, reverse=True)

    def retry_dead(self, job_id: str) -> bool:
        """Queue a dead job again with fresh attempts, under its id; False if it is no dead letter (kept).

        It runs in an empty context: what its dispatcher's context carried
        is not kept with a dead letter.
        """
        # Under the lock of _prune(), the one other remover of records (a worker's prune skips meanwhile).
        with self._pruning:
            record = self._record(job_id)
            if record is None or record.state != "dead" or record.expires <= self._clock():
                return False
            if job_id in self._unfinished:
                # Its worker has written the record and not yet let the job go (dead() does both,
                # in that order): the job is not a dead letter until then.
                return False
            envelope = make_envelope(job_id, record.name, record.payload, record.max_attempts, priority=record.priority)
            # Unfinished before its record goes, and ready only then: status() finds it in one of them
            # throughout, and the record its new run writes is never the one removed here.
            self._unfinished[job_id] = envelope
            self._records.pop(job_id, None)
            self._forget_expiry(job_id)
            self._ready.put(envelope)
        return True

    def purge_dead(self, older_than: float = 0.0) -> int:
        """Forget the dead jobs' records (those dead at least ``older_than`` seconds); how many."""
        until = time.time() - older_than
        # Under the lock of _prune() and retry_dead(), the others that remove records: a dead one stays as copied.
        with self._pruning:
            dead = [job_id for job_id, row in list(self._records.items()) if row[_STATE] == "dead"]
            return sum(
                1
                for job_id in dead
                if (row := self._records.get(job_id)) is not None
                and row[_FINISHED] <= until
                and self._records.pop(job_id, None) is not None
            )

    def kept_records(self) -> int:
        """Finished jobs' records held now (pruned as they expire, or beyond MAX_RECORDS)."""
        return len(self._records)

    def pending(self) -> int:
        return len(self._unfinished)

    def counts(self, queue: str) -> QueueCounts:
        """A snapshot of the jobs by state, read without stopping the workers (each figure may be a job off).

        Copies of the dicts, each taken in one step, so that no worker waits
        for the count; the oldest ready job is the first unfinished one (in
        dispatch order) neither running nor parked.
        """
        unfinished = list(self._unfinished)
        started = self._started.copy()
        running = sum(1 for at in started.values() if at is not _CANCELLED)
        parked_ids = {envelope.id for envelope in self.timers.items()}
        parked = sum(1 for job_id in unfinished if job_id in parked_ids and job_id not in started)
        oldest = next((job_id for job_id in unfinished if job_id not in started and job_id not in parked_ids), None)
        born = None if oldest is None else created_at(oldest)
        dead = sum(1 for row in list(self._records.values()) if row[_STATE] == "dead")
        return QueueCounts(
            queue,
            queued=max(0, len(unfinished) - running - parked),
            running=running,
            parked=parked,
            dead=dead,
            oldest_queued_age=None if born is None else max(0.0, time.time() - born),
        )

    def drained(self) -> bool:
        # Only parked jobs (a delay, a retry's backoff) left; a cancelled one waits there until due.
        unfinished = self._unfinished
        return len(unfinished) == sum(1 for _, envelope in self.timers.entries() if envelope.id in unfinished)

    def wait_finished(self, timeout: float) -> None:
        with self._idle:
            self._finish_waiters += 1
            try:
                self._idle.wait(timeout)
            finally:
                self._finish_waiters -= 1

    def wait_empty(self, timeout: float | None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: not self._unfinished, timeout)

    def open(self) -> None:
        self.timers.start()

    def close(self, deadline: float | None = None) -> None:
        self.timers.stop()

    def _finish(self, envelope: Envelope) -> None:
        # _unfinished first: status() finds a job there, then looks at _started.
        job_id = envelope.id
        self._unfinished.pop(job_id, None)
        self._started.pop(job_id, None)
        if self._progress:
            self._progress.pop(job_id, None)
        if not self._unfinished or self._finish_waiters:
            self._notify_finish()

    def _notify_finish(self) -> None:
        """Wake the waiters of a finish; called only when it matters to them (no job left, or a wait_finished()).

        A join() woken at every finish would take the GIL from the workers
        once per job while they drain. A waiter checks under the lock before
        it waits, so a notify sent after the pop is never lost.
        """
        with self._idle:
            self._idle.notify_all()


class InMemoryJobQueue(StoreQueue):
    """A job queue inside this process: for development, tests, scripts and small apps.

    Nothing is persisted: jobs still queued, parked or running when the
    process exits are lost, and a WARNING at exit says how many.
    ``workers=0`` queues jobs without running them.
    """

    def __init__(
        self,
        workers: int = 4,
        *,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        timeout: float | None = None,
        keep_result: float = DEFAULT_KEEP_RESULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._memory = MemoryStore(clock, keep_dead=keep_result)
        super().__init__(
            self._memory,
            workers=workers,
            shutdown_grace=shutdown_grace,
            clock=clock,
            timeout=timeout,
            keep_result=keep_result,
        )

    def settle_timers(self, timeout: float = 5.0) -> bool:
        """Wait until the retries, delays and deadlines the clock has made due are handed over."""
        return self._memory.timers.settle(timeout) and super().settle_timers(timeout)

    def kept_records(self) -> int:
        """How many finished jobs' records (for ``status()`` and ``result()``) this queue holds now."""
        return self._memory.kept_records()

    def counts(self) -> QueueCounts:
        """This queue's jobs by state, now; in memory ``dead`` counts the records kept, ``done_last_minute`` is 0."""
        return self._memory.counts(self.queue_label)

    def limits(self) -> list[LimitRow]:
        """The limit keys in use now (held, waited on or booked), with their permits: the dashboard's limits page."""
        return self._memory.limits(self.queue_label)

    def job_ids(self) -> list[str]:
        """The ids of the jobs this queue knows now, newest first: unfinished ones, and finished ones' kept records.

        Read without stopping the workers; ``status(id)`` reads each (None
        for a record that has just expired).
        """
        return self._memory.job_ids()

    def retry_dead(self, job_id: str) -> bool:
        """Queue a dead letter again with fresh attempts, under its id; False if there is no such dead letter.

        Its record goes (``status()`` says queued); it runs in an empty
        context (what its dispatcher's context carried is not kept).
        """
        if not isinstance(job_id, str):
            raise TypeError(f"a job id is a string, got {type(job_id).__name__}")
        return self._memory.retry_dead(job_id)

    def purge_dead(self, older_than: float = 0.0) -> int:
        """Forget this queue's dead letters' records (those dead at least ``older_than`` seconds); how many."""
        return self._memory.purge_dead(older_than)

    def parked(self) -> list[tuple[float, str]]:
        """``(due, job id)`` of the jobs waiting for a retry or a delay, earliest first."""
        unfinished = self._memory.unfinished_ids()
        return [(due, envelope.id) for due, envelope in self._memory.timers.entries() if envelope.id in unfinished]

    def stop_at_exit(self) -> None:
        """At interpreter exit: stop the workers at once, and warn of the jobs that are lost."""
        self.shutdown(grace=0)
        lost = self.pending_count()
        if lost:
            logger.warning(
                "the interpreter is exiting with %d job(s) still pending in an in-memory queue: they are lost "
                "(call shutdown() and join() before exit, or use a database backend)",
                lost,
                extra={"lost": lost},
            )
