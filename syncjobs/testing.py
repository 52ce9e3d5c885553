"""Run what an app dispatched, in its own tests, with the production engine and a clock the test moves.

::

    from syncjobs.testing import TestQueue

    def test_a_receipt_is_sent(app_queue):
        with TestQueue.diverting(app_queue) as jobs:
            checkout(order_id=7)              # the app's code dispatches as in production
            assert jobs.dispatched_of(send_receipt) == [{"args": [], "kwargs": {"order_id": 7}}]
            jobs.run_all()                    # runs it, and every retry, on the fake clock
            assert jobs.reports[-1].outcome is Outcome.DONE

A :class:`TestQueue` is an in-memory queue like any other: every job is
checked and encoded to JSON at dispatch, decoded for each run and run by the
same worker loop, with retries waiting on its clock. Nothing runs until
:meth:`TestQueue.run_all` (or ``start()``), so a test can look at what was
dispatched first.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from .function_tasks import Task
from .job import DEFAULT_PRIORITY, Job
from .memory import InMemoryJobQueue
from .payload import decode, encode
from .protocols import Delay
from .queue import Prepared, StoreQueue, delay_seconds
from .status import DEFAULT_KEEP_RESULT
from .worker import Outcome, RunReport

__all__ = ["Dispatched", "FakeClock", "Outcome", "RunReport", "TestQueue"]


class FakeClock:
    """A monotonic clock that moves only when told: ``clock.advance(seconds)``."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], object]] = []

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock on, then wait until what became due is handed to the workers."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back, got advance({seconds!r})")
        with self._lock:
            self._now += seconds
        for listener in list(self._listeners):
            listener()

    def on_advance(self, listener: Callable[[], object]) -> None:
        """Call ``listener()`` after every ``advance()``."""
        self._listeners.append(listener)


class Dispatched(NamedTuple):
    """One job as it was dispatched: its id, name, JSON payload (decoded), delay in seconds and priority."""

    id: str
    name: str
    payload: dict[str, Any]
    delay: float
    priority: int = DEFAULT_PRIORITY


class TestQueue(InMemoryJobQueue):
    """An in-memory queue for an app's tests: one worker by default, a :class:`FakeClock`, every dispatch recorded.

    ``reports`` lists every run's :class:`RunReport` in the order the runs ended.
    """

    __test__ = False  # not a test class, whatever pytest makes of its name

    def __init__(
        self,
        workers: int = 1,
        *,
        clock: FakeClock | None = None,
        timeout: float | None = None,
        keep_result: float = DEFAULT_KEEP_RESULT,
    ) -> None:
        self.clock = clock or FakeClock()
        super().__init__(workers, shutdown_grace=1.0, timeout=timeout, keep_result=keep_result, clock=self.clock)
        self.clock.on_advance(self.settle_timers)
        self.dispatched: list[Dispatched] = []
        self.reports: list[RunReport] = []
        self._record_lock = threading.Lock()
        self.observe_runs(self._record_run)

    @classmethod
    @contextmanager
    def diverting(cls, queue: StoreQueue, **options: Any) -> Iterator[TestQueue]:
        """A test queue that takes every dispatch made through ``queue`` (and its tasks) while the block runs.

        It runs ``queue``'s job classes and tasks, with its dead-letter callbacks
        and run wrappers; at the end of the block the test queue is shut down
        and ``queue`` dispatches to itself again.
        """
        test_queue = cls(**options)
        test_queue.share_jobs_of(queue)
        before = queue.divert_dispatches(test_queue)
        try:
            with test_queue:
                yield test_queue
        finally:
            queue.divert_dispatches(before)

    def __enter__(self) -> TestQueue:  # unlike a queue's, entering does not start the workers
        return self

    def prepare(
        self,
        job: Job,
        *,
        delay: Delay = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
    ) -> Prepared:
        # Checked: the payload is JSON, the priority in range.
        prepared = super().prepare(job, delay=delay, run_at=run_at, priority=priority)
        record = Dispatched(
            prepared.id,
            prepared.name,
            decode(encode(job)),
            delay_seconds(prepared.name, delay, run_at),
            type(job).PRIORITY if priority is None else priority,
        )

        def submit() -> str | None:
            # Under the lock: what a run it starts dispatches is recorded after it. A duplicate is not.
            with self._record_lock:
                holder = prepared.submit()
                if holder is None:
                    self.dispatched.append(record)
            return holder

        return Prepared(prepared.id, prepared.name, submit)

    def dispatch(
        self,
        job: Job,
        *,
        delay: Delay = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
    ) -> Any:
        prepared = self.prepare(job, delay=delay, run_at=run_at, priority=priority)
        return self.handle_of(prepared.name, prepared.id, prepared.submit())

    def dispatched_of(self, kind: type[Job] | Task[..., Any] | str) -> list[dict[str, Any]]:
        """The payloads (as they travel, in JSON) of the jobs of ``kind`` dispatched so far, in order.

        ``kind`` is a job class, a task or a NAME. A task's payload is
        ``{"args": [...], "kwargs": {...}}``, each argument given a name where it has one.
        """
        name = kind if isinstance(kind, str) else kind.name if isinstance(kind, Task) else kind.NAME
        with self._record_lock:
            return [item.payload for item in self.dispatched if item.name == name]

    def run_all(self, *, retries: bool = True, timeout: float = 10.0) -> list[RunReport]:
        """Run every job dispatched (and every job those dispatch) until none is left; the reports of these runs.

        With ``retries`` the clock jumps to each parked job's due time, so a
        job that fails runs all its retries (its backoff costs no real time)
        and ends done or dead; without, the jobs left waiting for a retry or a
        delay stay parked. ``TimeoutError`` if the jobs do not end within
        ``timeout`` real seconds (a job that blocks, say).
        """
        with self._record_lock:
            seen = len(self.reports)
        self.start()
        deadline = time.monotonic() + timeout
        while True:
            if not self._until(self.drained, deadline):
                raise TimeoutError(f"the jobs dispatched did not end within {timeout:g}s")
            parked = self.parked()
            if not (retries and parked):
                break
            if time.monotonic() >= deadline:  # jobs that keep dispatching more, say
                raise TimeoutError(f"the jobs dispatched did not end within {timeout:g}s")
            self.clock.advance(max(0.0, parked[0][0] - self.clock()))
        with self._record_lock:
            return self.reports[seen:]

    def _until(self, condition: Callable[[], bool], deadline: float) -> bool:
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.wait_finished(min(left, 0.01))  # woken by each finish; the poll covers its report
        return True

    def _record_run(self, report: RunReport) -> None:
        with self._record_lock:
            self.reports.append(report)
