"""What can be asked about a dispatched job: its status, its result, and the handle ``dispatch()`` returns."""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal, Protocol

from .errors import JobCancelled, JobFailed, JobNotFound
from .ids import created_at

State = Literal["queued", "scheduled", "running", "retrying", "done", "dead", "cancelled"]

#: The states a job ends in: it will not run again.
FINISHED: frozenset[str] = frozenset({"done", "dead", "cancelled"})

#: The longest progress note kept; a longer one is cut (progress must never fail a run).
MAX_NOTE = 200

#: Seconds a finished job's record (its state and result) is kept, unless a job or the queue says otherwise.
#: Ten minutes: long enough for a page that polls a job to read its result, and for
#: someone who looks a few minutes later; short enough that a busy queue keeps
#: a small table (or, in memory, a small dict) of them. (RQ keeps 500 s.)
DEFAULT_KEEP_RESULT = 600.0

#: Seconds result() waits for a job it cannot find that was made this recently (its transaction may be open).
UNSEEN_GRACE = 30.0
# How result() polls where nothing wakes it: a fast first look, then backing off to this.
_FIRST_LOOK = 0.005
_LONGEST_PAUSE = 0.5


@dataclasses.dataclass(frozen=True)
class QueueCounts:
    """How many of a queue's jobs are in each state, now: what ``queue.counts()`` and ``syncjobs stats`` show."""

    queue: str
    queued: int = 0  # ready to run now
    running: int = 0
    parked: int = 0  # waiting for a delay or a retry's backoff
    dead: int = 0
    #: Seconds the longest-waiting ready job has waited since it became due (in memory: since dispatched).
    oldest_queued_age: float | None = None
    done_last_minute: int = 0


@dataclasses.dataclass(frozen=True)
class Progress:
    """What a run last reported with ``current_job().progress(done, total, note)``."""

    done: float
    total: float | None = None
    note: str = ""

    @property
    def fraction(self) -> float | None:
        """``done / total`` (at most 1), or None without a total."""
        return None if self.total is None else min(1.0, self.done / self.total)

    def __str__(self) -> str:
        """``3 of 10 (30%) resizing``, as ``syncjobs show`` and the admin show it."""
        done = f"{self.done:g}" + ("" if self.total is None else f" of {self.total:g}")
        fraction = self.fraction
        shown = done if fraction is None else f"{done} ({fraction:.0%})"
        return f"{shown} {self.note}".rstrip()

    def to_json(self) -> str:
        return json.dumps({"done": self.done, "total": self.total, "note": self.note}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> Progress | None:
        """Read back what :meth:`to_json` wrote; None for None or for what it cannot have written."""
        if text is None:
            return None
        try:
            data = json.loads(text)
            return cls(float(data["done"]), None if data["total"] is None else float(data["total"]), str(data["note"]))
        except (ValueError, TypeError, KeyError):
            return None


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """One job's record, as ``queue.status(job_id)`` or ``handle.status()`` read it."""

    id: str
    name: str
    #: queued (waiting to run), scheduled (held back by a delay or run_at), running,
    #: retrying (a run failed; the next is queued or waiting for its backoff),
    #: done (its record is kept ``keep_result`` seconds), dead (a dead letter),
    #: cancelled (by ``cancel()``; kept like a done job's).
    state: State
    #: Runs begun and ended (a run in progress is not counted yet).
    attempts: int
    max_attempts: int
    #: Why a dead job failed.
    error: str | None = None
    #: What a done job's run returned (JSON-decoded); None for a job that returned nothing.
    result: Any = None
    created_at: datetime.datetime | None = None
    #: When its latest run began (None before any).
    started_at: datetime.datetime | None = None
    finished_at: datetime.datetime | None = None
    #: When a queued, scheduled or retrying job is due.
    run_at: datetime.datetime | None = None
    #: What its latest run last reported, if anything.
    progress: Progress | None = None
    #: The queue it was dispatched to (None in memory: an in-memory queue has no name).
    queue: str | None = None
    #: What it was dispatched with (JSON-decoded): the job's payload, a task's arguments.
    #: None only for a done job recorded before schema version 5 kept it.
    payload: Any = None
    #: Of the jobs due, higher runs first (-100 to 100; 0 for a done job recorded before schema version 6).
    priority: int = 0
    #: A dead job's last run raised: where (Python's traceback). None for a job that ended by its
    #: own ``Fatal``, ran out of time or could not run (``error`` says why), and for any other state.
    traceback: str | None = None

    @property
    def finished(self) -> bool:
        """The job will not run again (done, dead or cancelled)."""
        return self.state in FINISHED


def utc(epoch: float | None) -> datetime.datetime | None:
    """Epoch seconds as an aware UTC datetime."""
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(float(epoch), datetime.timezone.utc)


def decode_result(text: str | bytes | None) -> Any:
    return None if text is None else json.loads(text)


class StatusSource(Protocol):
    """What a handle asks: the queue that dispatched the job."""

    def status(self, job_id: str) -> JobStatus | None: ...

    def result(self, job_id: str, timeout: float | None = None) -> Any: ...

    def cancel(self, job_id: str) -> bool: ...


class JobHandle(str):
    """What ``dispatch()`` returns: the job's id (it *is* that string) and a way to ask about the job.

    Existing code that stores, compares or prints the id keeps working; a
    pickled or copied handle is a plain string. Each queue makes its handles
    with its own subclass (see :func:`handle_type`), which knows the queue:
    a handle is then made as cheaply as the string itself.
    """

    __slots__ = ()
    _source: ClassVar[StatusSource]
    #: True for what a dispatch of a unique job returned when another held its key: that job's handle.
    duplicate: ClassVar[bool] = False

    @property
    def id(self) -> str:
        return str(self)

    def status(self) -> JobStatus | None:
        """The job's record now; None once it is no longer kept (see ``keep_result``)."""
        return self._source.status(self.id)

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the job to end and return what its run returned; see ``queue.result()``."""
        return self._source.result(self.id, timeout)

    def cancel(self) -> bool:
        """Cancel the job; see ``queue.cancel()``."""
        return self._source.cancel(self.id)

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return str, (self.id,)

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r}, duplicate=True)" if self.duplicate else f"JobHandle({self.id!r})"


def handle_type(source: StatusSource, *, duplicate: bool = False) -> type[JobHandle]:
    """The class of ``source``'s handles: ``handle_type(queue)(job_id)`` is a handle of that queue's job.

    ``duplicate``: of the handles a duplicate dispatch returns (the holder's).
    """
    namespace = {
        "__slots__": (),
        "_source": source,
        "duplicate": duplicate,
        "__module__": __name__,
        "__qualname__": "JobHandle",
    }
    return type("JobHandle", (JobHandle,), namespace)


def wait_for_result(
    job_id: str,
    timeout: float | None,
    status: Callable[[str], JobStatus | None],
    wait: Callable[[float], object],
) -> Any:
    """Poll ``status`` until the job ends, pausing with ``wait`` (woken early by the queue's own finishes)."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        raise ValueError(f"timeout must be seconds >= 0 or None, got {timeout!r}")
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = _FIRST_LOOK
    seen = False
    while True:
        found = status(job_id)
        remaining = None if deadline is None else deadline - time.monotonic()
        if found is None:
            made = created_at(job_id)
            # A job made moments ago may not be there yet: dispatched in a
            # transaction not yet committed, or on_commit in Django. One seen
            # already has finished, and its record was not kept.
            young = not seen and made is not None and 0 <= time.time() - made < UNSEEN_GRACE
            if not young or (remaining is not None and remaining <= 0):
                raise JobNotFound(
                    f"job {job_id}: no record of it (never dispatched to this queue, not committed yet, or "
                    "finished more than its keep_result ago)"
                )
        elif found.state == "done":
            return found.result
        elif found.state == "cancelled":
            raise JobCancelled(f"job {found.name!r} ({job_id}) was cancelled", found)
        elif found.state == "dead":
            raise JobFailed(
                f"job {found.name!r} ({job_id}) is dead after {found.attempts} of {found.max_attempts} runs: "
                f"{found.error}",
                found,
            )
        elif remaining is not None and remaining <= 0:
            raise TimeoutError(f"job {found.name!r} ({job_id}) has not finished after {timeout}s: it is {found.state}")
        else:
            seen = True
        wait(pause if remaining is None else min(pause, remaining))
        pause = min(pause * 2, _LONGEST_PAUSE)
