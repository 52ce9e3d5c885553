"""The in-memory backend: one process, nothing persisted.

Ready envelopes wait in one ``queue.SimpleQueue`` that every worker blocks
on; retries and delayed jobs wait in a :class:`~syncjobs.timers.TimerHeap`
that moves them to the ready queue when due.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable

from .envelope import Envelope
from .queue import DEFAULT_SHUTDOWN_GRACE, StoreQueue
from .timers import TimerHeap

logger = logging.getLogger("syncjobs")


class _Wake:
    """Put on the ready queue to wake one blocked worker (it is never a job)."""


_WAKE = _Wake()


class MemoryStore:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        # SimpleQueue (C, lock-free for the GIL) rather than Queue: the loop
        # needs only put and a blocking get, and this is the hot path.
        self._ready: queue.SimpleQueue[Envelope | _Wake] = queue.SimpleQueue()
        self.timers: TimerHeap[Envelope] = TimerHeap(self._ready.put, clock=clock)
        # Unfinished jobs, one entry each: appended by put(), popped by complete()
        # and dead(). deque's append and pop are atomic, so neither the
        # dispatcher nor a worker takes a lock per job (a lock they shared
        # formed lock convoys under the GIL). 8 bytes a pending job.
        self._unfinished: collections.deque[None] = collections.deque()
        self._idle = threading.Condition()
        #: Threads in wait_finished(), which wants every finish (wait_empty() only the last).
        self._finish_waiters = 0

    def put(self, envelope: Envelope, delay: float) -> None:
        self._unfinished.append(None)
        if delay > 0:
            self.timers.push(self._clock() + delay, envelope)
        else:
            self._ready.put(envelope)

    def claim(self, stopping: threading.Event) -> Envelope | None:
        item = self._ready.get()
        # A stale wake-up from an earlier shutdown is harmless: the loop asks again.
        return None if item is _WAKE else item  # type: ignore[return-value]

    def complete(self, envelope: Envelope) -> None:
        self._finish()

    def dead(self, envelope: Envelope, error: str) -> None:
        self._finish()

    def park(self, envelope: Envelope, due: float) -> None:
        self.timers.push(due, envelope)

    def release(self, envelope: Envelope) -> None:
        self._ready.put(envelope)

    def wake(self, count: int) -> None:
        for _ in range(count):
            self._ready.put(_WAKE)

    def pending(self) -> int:
        return len(self._unfinished)

    def drained(self) -> bool:
        # Only parked jobs (a delay, a retry's backoff) left.
        return len(self._unfinished) == len(self.timers.entries())

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

    def _finish(self) -> None:
        self._unfinished.pop()
        # Woken only when it matters to them: a join() woken at every finish
        # would take the GIL from the workers once per job while they drain.
        # A waiter checks under the lock before it waits, so a notify sent
        # after the pop is never lost.
        if not self._unfinished or self._finish_waiters:
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._memory = MemoryStore(clock)
        super().__init__(self._memory, workers=workers, shutdown_grace=shutdown_grace, clock=clock, timeout=timeout)

    def settle_timers(self, timeout: float = 5.0) -> bool:
        """Wait until the retries, delays and deadlines the clock has made due are handed over."""
        return self._memory.timers.settle(timeout) and super().settle_timers(timeout)

    def parked(self) -> list[tuple[float, str]]:
        """``(due, job id)`` of the jobs waiting for a retry or a delay, earliest first."""
        return [(due, envelope.id) for due, envelope in self._memory.timers.entries()]

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
