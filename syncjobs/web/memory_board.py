"""The dashboard's :class:`~syncjobs.web.board.Board` on an in-memory queue, in the process that runs it.

An app (Flask, Django, a script) that runs an :class:`~syncjobs.InMemoryJobQueue`
mounts the dashboard in the same process: its jobs live nowhere else.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from typing import Literal

from ..database.admin import ScheduleRow, WorkerInfo
from ..limits import LimitRow
from ..memory import InMemoryJobQueue
from ..status import JobStatus
from ..worker import Outcome, RunReport
from .board import Overview

#: Seconds of throughput kept: the chart's hour (its first minute begins at most this long ago).
_WINDOW = 3600


class MemoryBoard:
    """A :class:`~syncjobs.web.board.Board` on ``queue``, an in-memory queue of this process.

    Throughput is counted here, from the moment the board is made: an
    ``observe_runs`` observer adds each run done to a ring of per-second
    counts over the last hour, so jobs done before the board was made are not
    counted. The queue's own pool is its one worker row while its workers run;
    it is "up" since the board first saw them running (the queue does not say
    when it started). Nothing here costs a job anything but that observer:
    the job list reads the queue's jobs when asked (:meth:`InMemoryJobQueue.job_ids`).
    The limits page lists the keys in use now (``queue.limits()``).
    """

    def __init__(self, queue: InMemoryJobQueue, description: str = "in memory · this process") -> None:
        if not isinstance(queue, InMemoryJobQueue):
            raise TypeError(f"MemoryBoard shows an InMemoryJobQueue, not {type(queue).__name__}")
        self._queue = queue
        self.description = description
        self._lock = threading.Lock()
        # Slot s % _WINDOW counts the runs done in second s (epoch), if _second[slot] == s.
        self._second = [-1] * _WINDOW
        self._done = [0] * _WINDOW
        #: When (epoch seconds) this board first saw the current workers running, and their threads then.
        self._up_since: float | None = None
        self._up_threads: set[threading.Thread] = set()
        queue.observe_runs(self._observe)
        self._workers_seen()

    def _observe(self, report: RunReport) -> None:
        """After every run, on its worker's thread: one count for a run done."""
        if report.outcome is not Outcome.DONE:
            return
        second = int(time.time())
        slot = second % _WINDOW
        with self._lock:
            if self._second[slot] != second:
                self._second[slot] = second
                self._done[slot] = 0
            self._done[slot] += 1

    def done_per_minute(self, minutes: int = 60, now: float | None = None) -> list[int]:
        """Runs done in each of the last ``minutes`` minutes (at most 60; the current one last), by this clock."""
        if not 0 < minutes <= _WINDOW // 60:
            raise ValueError(f"minutes must be 1 to {_WINDOW // 60}, got {minutes!r}")
        now_second = int(time.time() if now is None else now)
        first = (now_second // 60 - minutes + 1) * 60
        per_minute = [0] * minutes
        with self._lock:
            stamps, done = list(self._second), list(self._done)
        for second, count in zip(stamps, done, strict=True):
            if first <= second <= now_second:
                per_minute[(second - first) // 60] += count
        return per_minute

    def done_last_minute(self, now: float | None = None) -> int:
        """Runs done in the last 60 seconds."""
        now_second = int(time.time() if now is None else now)
        with self._lock:
            return sum(
                count
                for second, count in zip(self._second, self._done, strict=True)
                if now_second - 60 < second <= now_second
            )

    # -- the Board ----------------------------------------------------------------------

    def overview(self) -> Overview:
        counts = dataclasses.replace(self._queue.counts(), done_last_minute=self.done_last_minute())
        return Overview([counts], self.done_per_minute(), self._workers())

    def _workers_seen(self) -> float | None:
        """Since when (epoch seconds) this board has seen the queue's workers running; None: they do not run.

        A set of threads of which none was seen before is a restart: seen from now.
        """
        threads = self._queue.worker_threads()
        with self._lock:
            if not threads:
                self._up_since, self._up_threads = None, set()
            elif self._up_since is None or not self._up_threads.intersection(threads):
                self._up_since, self._up_threads = time.time(), set(threads)
            else:
                self._up_threads.update(threads)
            return self._up_since

    def _workers(self) -> list[WorkerInfo]:
        up_since = self._workers_seen()
        if up_since is None:
            return []
        host, pid = socket.gethostname(), os.getpid()
        return [
            WorkerInfo(
                f"{host}:{pid}:memory:{id(self._queue):x}",
                self._queue.queue_label,
                host,
                pid,
                self._queue.workers,
                max(0.0, time.time() - up_since),
                0.0,  # in this process: alive as the page is
            )
        ]

    def jobs(
        self, *, state: str | None = None, name: str | None = None, queue: str | None = None, limit: int = 100
    ) -> list[JobStatus]:
        label = self._queue.queue_label
        if queue is not None and queue != label:
            return []
        found: list[JobStatus] = []
        if limit <= 0:
            return found
        for job_id in self._queue.job_ids():
            status = self._queue.status(job_id)
            if status is None or (state is not None and not _in_state(status, state)):
                continue
            if name is not None and status.name != name:
                continue
            found.append(dataclasses.replace(status, queue=label))
            if len(found) >= limit:
                break
        return found

    def job(self, job_id: str) -> JobStatus | None:
        status = self._queue.status(job_id)
        return None if status is None else dataclasses.replace(status, queue=self._queue.queue_label)

    def retry(self, job_id: str) -> bool:
        return self._queue.retry_dead(job_id)

    def cancel(self, job_id: str) -> Literal["ended", "requested"] | None:
        if not self._queue.cancel(job_id):
            return None
        # A running job ends when its run returns; a waiting one has ended (or it finished meanwhile).
        after = self._queue.status(job_id)
        return "requested" if after is not None and after.state == "running" else "ended"

    def count_dead(self, queue: str) -> int:
        return self._queue.counts().dead if queue == self._queue.queue_label else 0

    def purge(self, queue: str) -> int:
        return self._queue.purge_dead() if queue == self._queue.queue_label else 0

    def schedules(self) -> list[ScheduleRow]:
        now = time.time()
        rows = []
        for state in self._queue.schedules():
            if state.next is None:  # a ScheduleRow always has a next slot; a schedule without one is not shown
                continue
            last = None if state.last is None else state.last.timestamp()
            following = state.next.timestamp()
            rows.append(
                ScheduleRow(
                    state.queue or self._queue.queue_label,
                    state.name,
                    state.description,
                    last,
                    following,
                    None if last is None else now - last,
                    following - now,
                )
            )
        return rows

    def limits(self) -> list[LimitRow]:
        return self._queue.limits()

    def queue_names(self) -> list[str]:
        return [self._queue.queue_label]


def _in_state(status: JobStatus, state: str) -> bool:
    """Whether the job is in ``state`` as a list filters by it: one of status()'s, or the overview's ready or parked."""
    if state == "ready":  # as counts() has it: neither running nor in the timer heap
        return status.state in ("queued", "retrying") and status.run_at is None
    if state == "parked":
        return status.state in ("scheduled", "retrying") and status.run_at is not None
    return status.state == state
