"""The one error family of syncjobs, and the cooperative cancel signal."""

from __future__ import annotations


class JobError(Exception):
    """Root of every error syncjobs raises or reads from a job.

    ``str()`` reads ``"<kind>: <message>"`` so that a dead letter's ``error``
    says at a glance whether the failure was transient, permanent or ours.
    """

    kind = "job error"

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}" if self.message else self.kind


class Retryable(JobError):
    """Raised by ``run()`` for a transient failure: the job is retried with backoff."""

    kind = "retryable"


class Fatal(JobError):
    """Raised by ``run()`` for a permanent failure: dead-lettered at once, no retry."""

    kind = "fatal"


class QueueError(JobError):
    """A queue-side problem: unregistered job, bad payload, duplicate NAME, bad settings."""

    kind = "queue error"


class Cancelled(BaseException):
    """Raised by a job that stops early because shutdown asked it to.

    A ``BaseException``, like ``KeyboardInterrupt``, so that a job's own
    ``except Exception`` cannot swallow it by accident.  The run is handed back
    to the queue with its attempt spent, exactly as a run aborted at shutdown.
    """


class JobNotFound(QueueError, LookupError):
    """No record of the job: it was never dispatched, or it finished longer than its ``keep_result`` ago."""

    kind = "job not found"


class JobCancelled(JobError, Cancelled):
    """What ``result()`` raises for a job that was cancelled: of the ``Cancelled`` family, and an ``Exception``."""

    kind = "job cancelled"

    def __init__(self, message: str, status: object) -> None:
        super().__init__(message)
        #: The job's :class:`~syncjobs.JobStatus` when it was read.
        self.status = status


class JobFailed(JobError):
    """What ``result()`` raises for a job that ended as a dead letter; ``status`` says how it ended."""

    kind = "job failed"

    def __init__(self, message: str, status: object) -> None:
        super().__init__(message)
        #: The job's :class:`~syncjobs.JobStatus` when it was read.
        self.status = status
