"""One timer thread over a heap of due times: retries and delayed jobs wait here.

Entries are ``(due, seq, item)``: the ``itertools.count`` tie-break means two
entries due at the same moment never compare their items (as ``sched`` does).
The thread sleeps on a ``Condition`` until the earliest entry is due, and is
woken when an earlier one arrives, so there is no polling and no thread per
timer.  The clock is injected so that tests move time instead of waiting.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

logger = logging.getLogger("syncjobs")

Clock = Callable[[], float]


class TimerHeap(Generic[T]):
    """Hands each item to ``on_due`` once the clock reaches its due time."""

    def __init__(self, on_due: Callable[[T], None], *, clock: Clock = time.monotonic, name: str = "syncjobs-timer"):
        self._on_due = on_due
        self._clock = clock
        self._name = name
        self._heap: list[tuple[float, int, T]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        # Bumped by every start() and stop(): a thread whose generation is
        # gone leaves its loop, so a quick stop-then-start never runs two.
        self._generation = 0
        self._thread: threading.Thread | None = None
        # Times the thread has handed over all that was due and gone to sleep.
        self._passes = 0

    def push(self, due: float, item: T) -> int:
        """Hold ``item`` until ``due`` (a reading of the clock); returns how many items wait now."""
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), item))
            if self._heap[0][2] is item:
                # Earlier than what the thread sleeps towards: wake it. All
                # waiters, since settle() callers wait on this Condition too.
                self._cond.notify_all()
            return len(self._heap)

    def prune(self, keep: Callable[[T], bool]) -> int:
        """Drop the waiting items ``keep`` refuses (in one pass, O(n)); returns how many wait on."""
        with self._cond:
            self._heap = [entry for entry in self._heap if keep(entry[2])]
            heapq.heapify(self._heap)
            return len(self._heap)

    def pop_due(self, now: float) -> list[T]:
        """Remove and return, earliest first, every item due at or before ``now``."""
        with self._cond:
            return self._pop_due_locked(now)

    def next_due(self) -> float | None:
        with self._cond:
            return self._heap[0][0] if self._heap else None

    def due_of(self, item: T) -> float | None:
        """When ``item`` is due, if it waits here (one pass over the heap, no sort)."""
        with self._cond:
            return next((due for due, _, waiting in self._heap if waiting is item), None)

    def items(self) -> list[T]:
        """Every waiting item, in no order: a copy, made without the sort ``entries()`` pays for."""
        with self._cond:
            return [item for _, _, item in self._heap]

    def entries(self) -> list[tuple[float, T]]:
        """``(due, item)`` for every waiting item, earliest first."""
        with self._cond:
            return [(due, item) for due, _, item in sorted(self._heap, key=lambda entry: entry[:2])]

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap)

    def settle(self, timeout: float = 5.0) -> bool:
        """Wake the thread and wait until it has handed over everything now due.

        For clocks that jump (tests): after ``settle()`` returns True, what is
        still in the heap was not due when the thread last looked.
        """
        with self._cond:
            if self._thread is None:
                return True
            seen = self._passes
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._passes > seen, timeout)

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._generation += 1
            thread = threading.Thread(target=self._run, args=(self._generation,), name=self._name, daemon=True)
            thread.start()
            self._thread = thread  # only once it runs: stop() joins it

    def stop(self) -> None:
        """Stop handing items over; waiting items keep their due times."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._generation += 1
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            # The thread runs no user code, only on_due, which must not block.
            thread.join(timeout=5.0)

    def _pop_due_locked(self, now: float) -> list[T]:
        due: list[T] = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        return due

    def _run(self, generation: int) -> None:
        while True:
            with self._cond:
                while True:
                    if self._generation != generation:
                        return
                    ready = self._pop_due_locked(self._clock())
                    if ready:
                        break
                    # Settled: everything due is handed over. Tell settle().
                    self._passes += 1
                    self._cond.notify_all()
                    timeout = self._heap[0][0] - self._clock() if self._heap else None
                    # Condition.wait() refuses timeouts past TIMEOUT_MAX (a
                    # delay of centuries); waking early just means looking again.
                    self._cond.wait(None if timeout is None else min(timeout, threading.TIMEOUT_MAX))
            # Hand over outside the lock, so push() never waits on on_due.
            for item in ready:
                try:
                    self._on_due(item)
                except BaseException:  # this thread serves every later item too
                    logger.exception("%s: handing over a due item failed", self._name)
