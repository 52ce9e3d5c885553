"""The protocols between the parts: what a queue offers, what the worker loop and a queue need of a store."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from typing_extensions import Self

from .dead_letters import DeadLetterCallback
from .envelope import Envelope
from .limits import LimitKey
from .status import JobHandle, JobStatus, Progress
from .unique import UniqueKey

if TYPE_CHECKING:
    from .function_tasks import TaskDecorator
    from .job import Job

J = TypeVar("J", bound="type[Job]")
C = TypeVar("C", bound=DeadLetterCallback)

Delay = float | datetime.timedelta | None


class Store(Protocol):
    """Where envelopes wait. The worker loop calls nothing else."""

    def claim(self, stopping: threading.Event) -> Envelope | None:
        """Block until an envelope is ready; ``None`` when woken by :meth:`wake`."""

    def complete(self, envelope: Envelope, result: str | None, keep: float, progress: str | None = None) -> None:
        """The run succeeded: the job is finished; its record (with ``result``, JSON) is kept ``keep`` seconds.

        ``progress`` is what the run last reported (JSON), kept with the record.
        """

    def park(self, envelope: Envelope, due: float) -> None:
        """Hold the envelope (its ``attempt`` already advanced) until the clock reads ``due``."""

    def dead(self, envelope: Envelope, error: str, traceback: str | None = None) -> None:
        """The job is finished as a dead letter; ``traceback``: where its last run raised, if it did."""

    def release(self, envelope: Envelope) -> None:
        """Put a claimed envelope back to be claimed again, with its ``attempt`` as set."""

    def cancelled(self, envelope: Envelope, progress: str | None) -> None:
        """cancel() asked for the job, and its run (if one began) has ended: the job is finished as cancelled."""

    def progress(self, envelope: Envelope, progress: Progress) -> None:
        """The running job reported how far it has come (at every report: keep it cheap)."""

    def wake(self, count: int) -> None:
        """Wake up to ``count`` workers blocked in :meth:`claim`."""


@runtime_checkable
class JobQueue(Protocol):
    """What every syncjobs backend offers; see the README for each method's contract."""

    def register(self, job_cls: J) -> J: ...

    @property
    def task(self) -> TaskDecorator: ...

    def dispatch(
        self,
        job: Job,
        *,
        delay: Delay = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
    ) -> JobHandle: ...

    def status(self, job_id: str) -> JobStatus | None: ...

    def result(self, job_id: str, timeout: float | None = None) -> Any: ...

    def cancel(self, job_id: str) -> bool: ...

    def start(self) -> None: ...

    def shutdown(self, grace: float | None = None) -> None: ...

    def pending_count(self) -> int: ...

    def join(self, timeout: float | None = None) -> bool: ...

    def on_dead_letter(self, callback: C) -> C: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class QueueStore(Store, Protocol):
    """A store as a queue drives it: the worker loop's calls plus intake and lifecycle."""

    def put(self, envelope: Envelope, delay: float, unique: UniqueKey | None = None) -> str | None:
        """Enqueue the envelope; with ``unique``, only if no other job holds that key: else the holder's id."""

    def status(self, job_id: str) -> JobStatus | None: ...

    def limit_with(self, limit_of: Callable[[Envelope], LimitKey | None], in_use: Callable[[], bool]) -> None:
        """Hold claimed jobs to their limits: ``limit_of(envelope)`` is a job's limit key, None for most.

        ``in_use()``: whether any job class of the queue declares a limit yet.
        """

    def cancel(self, job_id: str) -> str | None:
        """Cancel the job: ``"ended"`` if it was waiting (it never runs), ``"requested"`` if it runs; else None."""

    def pending(self) -> int: ...

    def drained(self) -> bool: ...

    def wait_finished(self, timeout: float) -> None: ...

    def wait_empty(self, timeout: float | None) -> bool: ...

    def open(self) -> None: ...

    def close(self, deadline: float | None = None) -> None:
        """Stop, writing what is left until the monotonic ``deadline``, if any."""
