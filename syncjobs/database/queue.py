"""``DatabaseJobQueue``: the JobQueue contract over a table, across processes and machines."""

from __future__ import annotations

import contextvars
import datetime
import logging
import math
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from ..envelope import DeadLetter, Envelope
from ..errors import QueueError
from ..job import Job, check_keep_result
from ..payload import dead_letter_from_text
from ..protocols import Delay
from ..queue import DEFAULT_SHUTDOWN_GRACE, StoreQueue
from ..scheduler import ScheduleRecords, ScheduleState
from ..status import DEFAULT_KEEP_RESULT, JobHandle, JobStatus, QueueCounts
from ..unique import UniqueKey
from ..urls import mask_url
from ..worker import DEFAULT_UNKNOWN_JOB_WAIT
from .admin import TableAdmin
from .dialects import Connector, check_connection, check_table
from .schedule_records import DatabaseRecords
from .schema import SCHEMA_VERSION
from .store import DatabaseStore

logger = logging.getLogger("syncjobs.database")


class DatabaseJobQueue(StoreQueue):
    """A durable job queue in a SQLite, PostgreSQL or MySQL/MariaDB table.

    Many processes on many machines may share one table: each row is claimed
    by one worker at a time, under a lease renewed while the job runs; the job
    of a worker that died runs again once its lease expires.

    ``connect_args``: the driver's keyword arguments, over what ``url`` says
    (the Django integration passes the parameters Django itself connects with).

    ``unknown_job_wait``: a job whose NAME this process has no class for (an
    old worker meeting a new job in a rolling deploy) is handed back unrun,
    its attempt unspent, for a worker that knows it, until this many seconds
    after the worker first met it; then it is a dead letter. 0: a dead letter at once.
    """

    dispatch_options: ClassVar[frozenset[str]] = frozenset({"delay", "run_at", "priority", "connection"})
    cancels_only_here: ClassVar[bool] = False

    def __init__(
        self,
        url: str,
        *,
        workers: int = 4,
        queue: str = "default",
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        timeout: float | None = None,
        keep_result: float = DEFAULT_KEEP_RESULT,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        table: str = "syncjobs_jobs",
        carry: Iterable[contextvars.ContextVar[Any]] = (),
        auto_schema: bool = True,
        dispatch_timeout: float = 5.0,
        prefetch: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        connect_args: Mapping[str, Any] | None = None,
        unknown_job_wait: float = DEFAULT_UNKNOWN_JOB_WAIT,
    ) -> None:
        check_table(table)
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0):
            raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
        if not isinstance(queue, str) or not 0 < len(queue) <= 100 or not queue.isprintable():
            raise QueueError(f"queue name {queue!r} must be 1 to 100 printable characters")
        for value, what in ((lease, "lease"), (poll_interval, "poll_interval"), (dispatch_timeout, "dispatch_timeout")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{what} must be a number of seconds > 0, got {value!r}")
        try:
            check_keep_result(unknown_job_wait, "unknown_job_wait")  # seconds >= 0, as a keep is
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        self.url = url
        self.queue_name = queue
        self.unique_scope = queue
        self.table = table
        self.auto_schema = auto_schema
        # What for_queue() builds a twin from.
        self._options: dict[str, Any] = dict(
            lease=lease,
            poll_interval=poll_interval,
            table=table,
            carry=list(carry),
            auto_schema=auto_schema,
            dispatch_timeout=dispatch_timeout,
            prefetch=prefetch,
            clock=clock,
            connect_args=connect_args,
            timeout=timeout,
            keep_result=keep_result,
            unknown_job_wait=unknown_job_wait,
        )
        self._schema_ready = False
        #: This queue and the twins for_queue() made of it (or it of them): what carry_also() reaches.
        self._twins: weakref.WeakSet[DatabaseJobQueue] = weakref.WeakSet([self])
        connector = Connector(url, connect_args)
        check_table(table, connector.dialect)
        self._dialect = connector.dialect
        self._db = DatabaseStore(
            connector,
            table=table,
            queue=queue,
            lease=float(lease),
            poll_interval=float(poll_interval),
            carry=list(carry),
            dispatch_timeout=float(dispatch_timeout),
            # One batch ahead of the workers by default, as Celery and Dramatiq
            # prefetch: a claim's round trip overlaps the runs. 0 for long jobs.
            prefetch=workers if prefetch is None else prefetch,
            workers=workers,
            clock=clock,
        )
        super().__init__(
            self._db,
            workers=workers,
            shutdown_grace=shutdown_grace,
            clock=clock,
            timeout=timeout,
            keep_result=keep_result,
        )
        self._prefetch = self._db.prefetch
        # A rolling deploy: a job this process has no class for waits for one that has (see WorkerPool._unknown).
        self._pool.unknown_job_wait = float(unknown_job_wait)
        self._db.on_expired_dead = self._expired_dead
        self._db.on_cancel_requested = self._pool.cancel_run  # rows this process holds: remembered by lease
        self._db.keep_cancelled = self.keep_result
        #: The table's operator view (stats, dead letters of every queue), on this queue's connections.
        self.admin: TableAdmin = self._db.admin

    @property
    def connect_args(self) -> Mapping[str, Any]:
        """The driver's keyword arguments given over what :attr:`url` says (a copy)."""
        return dict(self._options["connect_args"] or {})

    @property
    def unknown_job_wait(self) -> float:
        """Seconds a job of a NAME with no class here waits for a worker that knows it, from when this one met it."""
        return self._pool.unknown_job_wait

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({mask_url(self.url)!r}, queue={self.queue_name!r}, "
            f"table={self.table!r}, workers={self.workers})"
        )

    def for_queue(
        self,
        queue: str | None = None,
        *,
        workers: int | None = None,
        shutdown_grace: float | None = None,
        timeout: float | None = None,
        keep_result: float | None = None,
    ) -> DatabaseJobQueue:
        """A queue on the same table and settings, for another queue name, worker count, grace, timeout or keep.

        It runs the same job classes, inside the same run wrappers, and calls
        the same dead-letter callbacks: registering on either registers on both.
        """
        options = dict(self._options)
        if timeout is not None:
            options["timeout"] = timeout
        if keep_result is not None:
            options["keep_result"] = keep_result
        twin = DatabaseJobQueue(
            self.url,
            workers=self.workers if workers is None else workers,
            queue=self.queue_name if queue is None else queue,
            shutdown_grace=self.shutdown_grace if shutdown_grace is None else shutdown_grace,
            **options,
        )
        twin.share_jobs_of(self)
        twin._twins = self._twins
        self._twins.add(twin)
        return twin

    # -- schema -------------------------------------------------------------

    def install_schema(self) -> None:
        """Create or upgrade the tables; safe to call again, from any process (``syncjobs migrate`` runs it)."""
        self.admin.migrate()
        self._schema_ready = True

    def _ensure_schema(self) -> None:
        if not self._schema_ready and self.auto_schema:
            self.install_schema()

    def _check_schema(self) -> None:
        """Workers need the current tables: with ``auto_schema=False``, refuse to start on older ones."""
        if self._schema_ready:
            return
        if self.auto_schema:
            self.install_schema()
            return
        found = self.admin.schema_version()
        if found != SCHEMA_VERSION:
            raise QueueError(
                f"table {self.table!r} is at schema version {found}, this syncjobs needs {SCHEMA_VERSION}: "
                f"run `syncjobs migrate --url URL` (auto_schema is off)"
            )
        self._schema_ready = True

    # -- the contract, plus the database's own -------------------------------

    def start(self, *, held: bool = False) -> None:
        self._check_schema()
        # Held workers want no row yet: none is claimed ahead for them until release().
        self._db.prefetch = 0 if held else self._prefetch
        super().start(held=held)

    def release(self) -> None:
        self._db.prefetch = self._prefetch
        super().release()

    def stop_claiming(self) -> None:
        # Nor claim ahead: rows leased to workers that will not run them wait for no one.
        self._db.prefetch = 0
        super().stop_claiming()

    def dispatch(
        self,
        job: Job,
        *,
        delay: Delay = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
        connection: Any = None,
    ) -> JobHandle:
        """Insert ``job``; with ``connection``, inside the caller's transaction, which the queue never commits."""
        return self.dispatch_many([job], delay=delay, run_at=run_at, priority=priority, connection=connection)[0]

    def _check_envelope(self, envelope: Envelope) -> None:
        self._check_carried(envelope)

    def _put(self, envelope: Envelope, seconds: float, unique: UniqueKey | None) -> str | None:
        self._ensure_schema()  # once every check has passed: a refused dispatch creates no table
        return super()._put(envelope, seconds, unique)

    def _check_carried(self, envelope: Envelope) -> None:
        """Refuse a carried value that is not JSON, before any insert, naming the job."""
        try:
            self._db.carried(envelope.context)
        except QueueError as exc:
            raise QueueError(f"job {envelope.name!r}: {exc.message}") from exc

    def dispatch_many(
        self,
        jobs: Sequence[Job],
        *,
        delay: Delay = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
        connection: Any = None,
    ) -> list[JobHandle]:
        """Insert ``jobs`` in one transaction: all of them or, if anything is refused, none; their handles.

        ``priority``, if given, is every job's; else each has its class's ``PRIORITY``.
        """
        diverted = self._diverted_to
        if diverted is not None:  # all checked before any is enqueued, as here
            prepared = [diverted.prepare(job, delay=delay, run_at=run_at, priority=priority) for job in jobs]
            return [diverted.handle_of(each.name, each.id, each.submit()) for each in prepared]
        checked = [self._checked(job, delay, run_at, priority) for job in jobs]
        if not checked:
            return []
        if connection is not None:
            check_connection(self._dialect, connection, checked[0][0].name)
        items = [(envelope, seconds) for envelope, seconds, _ in checked]
        keys = [unique for _, _, unique in checked]
        self._ensure_schema()
        holders = self._db.put_many(items, connection, keys)
        return [
            self.handle_of(envelope.name, envelope.id, self._enqueued(envelope.name, holder))
            for (envelope, _), holder in zip(items, holders, strict=True)
        ]

    def pending_count(self) -> int:
        self._ensure_schema()
        return super().pending_count()

    def schedules(self) -> list[ScheduleState]:
        self._ensure_schema()
        return [state._replace(queue=self.queue_name) for state in super().schedules()]

    def _schedule_records(self) -> ScheduleRecords:
        # Through the store's connections, within its dispatch timeout: the scheduler tries again later.
        def run(operation: Callable[[Any], Any]) -> Any:
            return self._db.run(operation, deadline=self._db.dispatch_timeout)

        return DatabaseRecords(run, self._dialect, self.table, self.queue_name)

    def status(self, job_id: str) -> JobStatus | None:
        self._ensure_schema()
        return super().status(job_id)

    def cancel(self, job_id: str) -> bool:
        self._ensure_schema()
        return super().cancel(job_id)

    @property
    def jobs_source(self) -> Hashable:
        return (self.url, self.table, self.queue_name)

    def carry_also(self, var: contextvars.ContextVar[Any]) -> None:
        """Carry ``var``'s JSON value with each job dispatched from now on, as ``carry=`` does; on every twin too."""
        for queue in list(self._twins):
            if var not in queue._options["carry"]:
                queue._options["carry"].append(var)
            queue._db.carry_also(var)

    @property
    def queue_label(self) -> str:
        return self.queue_name

    def counts(self) -> QueueCounts:
        """This queue's jobs by state, now, as the table holds them (every process's); ``done_last_minute`` unread."""
        self._ensure_schema()
        found = [counts for counts in self.admin.counts() if counts.queue == self.queue_name]
        return found[0] if found else QueueCounts(self.queue_name)

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """This queue's dead letters, oldest first."""
        self._ensure_schema()
        return [row.dead_letter() for row in self.admin.dead_letters(queue=self.queue_name, limit=limit)]

    def retry_dead(self, job_id: str) -> bool:
        """Queue a dead letter again with fresh attempts; False if there is no such dead letter."""
        self._ensure_schema()
        return bool(self.admin.retry([job_id], queue=self.queue_name))

    def purge_dead(self, older_than: float = 0.0) -> int:
        """Delete this queue's dead letters (those dead at least ``older_than`` seconds); returns how many."""
        self._ensure_schema()
        return self.admin.purge(older_than=older_than, queue=self.queue_name)

    def _expired_dead(self, envelope: Envelope, error: str) -> None:
        dead = dead_letter_from_text(envelope.id, envelope.name, envelope.payload, envelope.attempt, error)
        self._dead_letters.emit(dead, envelope.context)


#: The historical name; not PostgreSQL-only.
PgJobQueue = DatabaseJobQueue
