"""The scheduler: a thread beside a queue's workers that dispatches each schedule's job as its slots fall.

Every process that runs a queue's workers runs its schedules too, and each
dispatches every slot; a slot's job goes in under a unique key of (schedule,
slot), so only the first dispatch of a slot enqueues it, in any number of
processes, on every backend (see :mod:`syncjobs.unique`). No process is
elected: one that dies leaves the others dispatching.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from .errors import QueueError
from .job import Job
from .schedules import MAX_CATCH_UP, Schedule
from .unique import UniqueKey

logger = logging.getLogger("syncjobs")

#: Seconds a slot's key holds: far longer than any process may lag behind the others' dispatch of that slot.
SLOT_KEY_HOLDS = 86_400.0
#: Seconds before a dispatch that failed (the database down, say) is tried again.
RETRY_PAUSE = 1.0

#: What a schedule dispatches: a job, or a function of the slot (an aware datetime in the schedule's zone).
JobMaker = Callable[[datetime.datetime], Job]


@dataclasses.dataclass(frozen=True)
class Periodic:
    """A named schedule and the job it dispatches."""

    name: str
    schedule: Schedule
    make: JobMaker

    def job_for(self, slot: float) -> Job:
        job = self.make(self.schedule.local(slot))
        if not isinstance(job, Job):
            raise QueueError(f"schedule {self.name!r}: its job function returned {job!r}, not a syncjobs.Job")
        return job


class ScheduleState(NamedTuple):
    """A schedule as ``queue.schedules()`` lists it: its last slot dispatched and the next, as aware datetimes (UTC)."""

    name: str
    description: str
    last: datetime.datetime | None
    next: datetime.datetime | None
    queue: str | None = None


class ScheduleRecords(Protocol):
    """Where each schedule's last slot is kept: in memory, or the database's ``<table>_schedules``."""

    def last_slots(self) -> dict[str, float]:
        """The last slot dispatched, by schedule name, as recorded (any process's)."""

    def record(self, name: str, description: str, last: float, following: float) -> None:
        """``last`` was dispatched (kept if later than what is there); ``following`` comes next."""

    def announce(self, name: str, description: str, following: float) -> None:
        """A schedule no process has run yet: listed with no last slot (nothing, if it is there already)."""


class MemoryRecords:
    """The records of an in-memory queue: its process's own."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[str, float | None, float]] = {}
        self._lock = threading.Lock()

    def last_slots(self) -> dict[str, float]:
        with self._lock:
            return {name: last for name, (_, last, _) in self._rows.items() if last is not None}

    def record(self, name: str, description: str, last: float, following: float) -> None:
        with self._lock:
            before = self._rows.get(name)
            if before is None or before[1] is None or last >= before[1]:
                self._rows[name] = (description, last, following)

    def announce(self, name: str, description: str, following: float) -> None:
        with self._lock:
            self._rows.setdefault(name, (description, None, following))


def slot_key(scope: str, name: str, slot: float) -> UniqueKey:
    """The key a slot's job is dispatched under: one job per (queue, schedule, slot)."""
    text = json.dumps([scope, "syncjobs.schedule", name, repr(slot)], separators=(",", ":"))
    return UniqueKey(hashlib.sha256(text.encode()).hexdigest(), "seconds", SLOT_KEY_HOLDS)


class Scheduler:
    """Dispatches the slots of a queue's schedules from a thread of its own, while the queue runs."""

    def __init__(
        self,
        dispatch: Callable[[Periodic, float], Any],
        records: ScheduleRecords,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._dispatch = dispatch
        self._records = records
        self._clock = clock
        self._periodic: dict[str, Periodic] = {}
        self._lock = threading.Lock()
        # Set to make the loop look again at once: a schedule added, or a stop.
        self._wake = threading.Event()
        #: The running thread's own stop (a thread that outlived its stop's timeout never runs on).
        self._thread_stop = threading.Event()
        #: Between start() and stop(): a thread runs while there is a schedule to run.
        self._active = False
        self._thread: threading.Thread | None = None
        self._previous: threading.Thread | None = None
        #: The last slot dispatched (or skipped), by schedule name: only the scheduler's thread touches it.
        self._last: dict[str, float] = {}

    def add(self, periodic: Periodic) -> None:
        with self._lock:
            if periodic.name in self._periodic:
                raise QueueError(f"schedule {periodic.name!r} is already defined on this queue")
            self._periodic[periodic.name] = periodic
            if self._active:
                self._spawn()
        self._wake.set()

    @property
    def records(self) -> ScheduleRecords:
        return self._records

    def periodic(self) -> list[Periodic]:
        with self._lock:
            return list(self._periodic.values())

    def start(self) -> None:
        """Run the schedules (those added later too) in a thread of their own, once there is one."""
        with self._lock:
            self._active = True
            # Where each schedule left off is read again: other processes ran its slots meanwhile.
            self._last = {}
            if self._periodic:
                self._spawn()

    def _spawn(self) -> None:
        if self._thread is None:
            if self._previous is not None:  # stopped, but out of its stop's time: it ends at its next check
                self._previous.join(RETRY_PAUSE)
            self._thread_stop = stop = threading.Event()
            self._thread = threading.Thread(target=self._loop, args=(stop,), name="syncjobs-scheduler", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; a dispatch it is making is waited for up to ``timeout`` seconds."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._previous = thread
            self._active = False
            self._thread_stop.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _loop(self, stop: threading.Event) -> None:
        while True:
            self._wake.clear()
            if stop.is_set():  # after the clear: a stop's wake-up that came before it is not lost
                return
            try:
                pause = self.tick(stop)
            except Exception:  # a bug here must not stop the schedules for good: logged, tried again
                logger.exception("the scheduler failed; trying again in %gs", RETRY_PAUSE)
                pause = RETRY_PAUSE
            self._wake.wait(pause)

    def tick(self, stop: threading.Event | None = None) -> float:
        """Dispatch what is due now (until ``stop`` is set); seconds until the next slot of any schedule."""
        now = self._clock()
        periodic = self.periodic()
        unknown = [p for p in periodic if p.name not in self._last]
        if unknown:
            recorded = self._records.last_slots()
            for each in unknown:
                last = recorded.get(each.name)
                if last is None:
                    # A schedule never run before starts now (its first slot is the next one); listed at once.
                    last = now
                    self._records.announce(each.name, each.schedule.describe(), each.schedule.next_after(now))
                self._last[each.name] = last
        pause = 60.0
        for each in periodic:
            if stop is not None and stop.is_set():
                break
            try:
                self._run_due(each, now, stop)
                pause = min(pause, each.schedule.next_after(self._last[each.name]) - self._clock())
            except Exception:  # the database down, say: the slot is dispatched once it is back
                logger.exception(
                    "schedule %r: a slot could not be dispatched; trying again in %gs", each.name, RETRY_PAUSE
                )
                pause = min(pause, RETRY_PAUSE)
        return max(0.0, pause)

    def _run_due(self, each: Periodic, now: float, stop: threading.Event | None) -> None:
        schedule, last = each.schedule, self._last[each.name]
        edge = now - schedule.grace
        missed: list[float] = []
        if last < edge and schedule.catch_up != "skip":
            missed = schedule.latest(last, edge, MAX_CATCH_UP if schedule.catch_up == "all" else 1)
        due = [*missed, *schedule.slots(max(last, edge), now)]
        for slot in due:
            if stop is not None and stop.is_set():
                return  # stopped (the queue shuts down): the slots left are another process's, or missed
            self._dispatch(each, slot)
            self._last[each.name] = slot
            self._records.record(each.name, schedule.describe(), slot, schedule.next_after(slot))
        latest = schedule.latest(self._last[each.name], now, 1)
        if latest:  # slots skipped (catch_up="skip"): they are past
            self._last[each.name] = latest[0]
