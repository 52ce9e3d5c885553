"""syncjobs: background jobs for synchronous Python (Django, Flask, scripts).

Everything public is importable from here; see README.rst for the contract.
"""

from .context import RunInfo, current_job
from .database import DatabaseJobQueue, DatabaseUnavailable, PgJobQueue
from .envelope import DeadLetter
from .errors import Cancelled, Fatal, JobError, JobFailed, JobNotFound, QueueError, Retryable
from .function_tasks import Task
from .job import DEFAULT_MAX_ATTEMPTS, Job
from .limits import Limit
from .memory import InMemoryJobQueue
from .protocols import JobQueue
from .queue import DEFAULT_SHUTDOWN_GRACE
from .retry import MAX_BACKOFF, retry_backoff, wait_seconds
from .scheduler import ScheduleState
from .schedules import Schedule
from .settings import connect, from_settings, inmemory_from_settings
from .status import DEFAULT_KEEP_RESULT, JobHandle, JobStatus, QueueCounts
from .unique import Unique
from .worker import Outcome, RunReport

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_KEEP_RESULT",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_SHUTDOWN_GRACE",
    "MAX_BACKOFF",
    "Cancelled",
    "DatabaseJobQueue",
    "DatabaseUnavailable",
    "DeadLetter",
    "Fatal",
    "InMemoryJobQueue",
    "Job",
    "JobError",
    "JobFailed",
    "JobHandle",
    "JobNotFound",
    "JobQueue",
    "JobStatus",
    "Limit",
    "Outcome",
    "PgJobQueue",
    "QueueCounts",
    "QueueError",
    "Retryable",
    "RunInfo",
    "RunReport",
    "Schedule",
    "ScheduleState",
    "Task",
    "Unique",
    "__version__",
    "connect",
    "current_job",
    "from_settings",
    "inmemory_from_settings",
    "retry_backoff",
    "wait_seconds",
]
