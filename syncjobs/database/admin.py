"""The operator's view of a jobs table: schema, stats and dead letters, across queues.

What ``syncjobs migrate``, ``stats`` and ``dead`` print, and what a queue's
own ``dead_letters()``, ``retry_dead()`` and ``purge_dead()`` run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..envelope import DeadLetter
from ..errors import QueueError
from ..limits import LimitRow
from ..payload import dead_letter_from_text
from ..status import JobStatus, Progress, QueueCounts, State, decode_result, utc
from . import queries
from .connections import Connections, DatabaseUnavailable
from .dialects import Connector, check_table
from .fetcher import row_priority
from .permits import WAITING_AT
from .schema import DONE_COUNTS_KEPT, FINISHED_KEPT, SCHEMA_VERSION, install, record_version
from .unique_keys import UniqueKeys

_PERMIT = f"{WAITING_AT:.0f}"
#: The states a job list filters by, each with its condition on the jobs table and on
#: the kept records of done jobs. 'claimed' rows wait in a worker's buffer; rows due
#: at WAITING_AT wait for a limit's permit: both are listed as status() shows them.
JOB_STATES: dict[str | None, tuple[str, str]] = {
    "queued": (
        f"state IN ('queued', 'claimed') AND attempt = 0 AND (run_at <= {{now_once}} OR run_at >= {_PERMIT})",
        "1 = 0",
    ),
    "scheduled": (f"state = 'queued' AND attempt = 0 AND run_at > {{now_once}} AND run_at < {_PERMIT}", "1 = 0"),
    "running": ("state = 'running'", "1 = 0"),
    "retrying": ("state IN ('queued', 'claimed') AND attempt > 0", "1 = 0"),
    "dead": ("state = 'dead'", "1 = 0"),
    "cancelled": ("state = 'cancelled'", "1 = 0"),
    "done": ("1 = 0", "1 = 1"),
    # As the overview counts them (QueueCounts): ready now whatever the attempt, and parked (a delay,
    # a retry's backoff, a limit's permit).
    "ready": ("state = 'queued' AND run_at <= {now_once}", "1 = 0"),
    "parked": ("state = 'queued' AND run_at > {now_once}", "1 = 0"),
    None: ("1 = 1", "1 = 1"),
}


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    id: str
    queue: str
    host: str
    pid: int
    threads: int
    up_seconds: float
    heartbeat_age: float


@dataclasses.dataclass(frozen=True)
class ScheduleRow:
    """A periodic job's schedule as the table records it: the last slot a process dispatched, and the next."""

    queue: str
    name: str
    description: str
    #: None: no process has dispatched a slot yet.
    last_slot: float | None
    next_slot: float
    #: Seconds since the last slot and until the next, by the database's clock (negative: overdue).
    last_age: float | None
    next_in: float


@dataclasses.dataclass(frozen=True)
class Stats:
    queues: list[QueueCounts]
    workers: list[WorkerInfo]
    schedules: list[ScheduleRow] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DeadRow:
    """A dead letter as the table keeps it."""

    id: str
    queue: str
    name: str
    attempts: int
    max_attempts: int
    error: str
    payload: str
    context: str | None
    created_at: float
    finished_at: float
    #: Seconds since the job died, by the database's clock.
    age: float

    def dead_letter(self) -> DeadLetter:
        return dead_letter_from_text(self.id, self.name, self.payload, self.attempts, self.error)


@dataclasses.dataclass(frozen=True)
class Pruned:
    """What :meth:`TableAdmin.prune` deleted, by kind."""

    records: int
    cancelled: int
    finished_ids: int
    workers: int
    done_counts: int
    #: Unique jobs' keys no job holds any more.
    unique_keys: int = 0


class TableAdmin:
    """Reads and repairs one jobs table (all its queues, or one with ``queue=``)."""

    def __init__(
        self,
        connections: Connections,
        *,
        table: str,
        timeout: float = 5.0,
        on_requeue: Callable[[], None] = lambda: None,
    ) -> None:
        """On ``connections`` (a queue's own, or its own from :meth:`connect`).

        Each call gives up after ``timeout`` seconds with ``DatabaseUnavailable``;
        ``on_requeue`` is called after dead letters went back to the queue.
        """
        self._db = connections
        self.table = check_table(table)
        self.timeout = timeout
        self._on_requeue = on_requeue

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        table: str = "syncjobs_jobs",
        timeout: float = 5.0,
        connect_args: Mapping[str, Any] | None = None,
    ) -> TableAdmin:
        """An admin of its own connections (``connect_args`` as a queue takes them); :meth:`close` them when done."""
        connector = Connector(url, connect_args)
        check_table(table, connector.dialect)
        return cls(Connections(connector), table=table, timeout=timeout)

    def close(self) -> None:
        """Close the connections this admin's process opened (a queue's admin: the queue's)."""
        self._db.close()

    def _sql(self, template: str, queue: str | None = None) -> str:
        dialect = self._db.dialect
        text = dialect.sql(template, self.table)
        return text.replace("{queue_filter}", "" if queue is None else f" AND queue = {dialect.placeholder}")

    def _run(self, sql: str, params: Sequence[Any], *, rows: bool = True) -> Any:
        def execute(cursor: Any) -> Any:
            cursor.execute(sql, tuple(params))
            return cursor.fetchall() if rows else int(cursor.rowcount)

        return self._db.run(execute, timeout=self.timeout)

    # -- schema ----------------------------------------------------------------

    def schema_version(self) -> int | None:
        """The version the table is at; ``None`` when there is no table yet."""

        def read(cursor: Any) -> int | None:
            cursor.execute(self._sql(queries.SCHEMA_VERSION))
            row = cursor.fetchone()
            return None if row is None or row[0] is None else int(row[0])

        try:
            return self._db.run(read, timeout=self.timeout)
        except DatabaseUnavailable:
            raise
        except Exception:  # noqa: BLE001 - no such table: a database that has never seen syncjobs
            return None

    def ddl(self) -> list[str]:
        """The statements :meth:`migrate` would run on this database now, for teams that run migrations themselves.

        On a database without the tables, what creates them; on an older
        version's, what upgrades it too.
        """
        planned: list[str] = []

        def plan(cursor: Any) -> None:
            install(self._db.dialect, self.table, cursor, run=planned.append)

        self._db.run(plan, timeout=self.timeout)
        return [*planned, *record_version(self.table)]

    def migrate(self) -> int | None:
        """Create or upgrade the tables; idempotent, safe from many processes at once.

        Returns the version found before (``None``: there was no table).
        """
        found = self.schema_version()
        if found is not None and found > SCHEMA_VERSION:
            raise QueueError(
                f"table {self.table!r} is at schema version {found}, newer than this syncjobs knows "
                f"({SCHEMA_VERSION}): upgrade syncjobs"
            )

        def upgrade(cursor: Any) -> None:
            install(self._db.dialect, self.table, cursor)
            cursor.execute(self._sql(queries.SCHEMA_VERSION))
            row = cursor.fetchone()
            if row is None or row[0] is None or int(row[0]) < SCHEMA_VERSION:
                for statement in record_version(self.table):
                    cursor.execute(statement)

        try:
            self._db.transaction(upgrade, timeout=self.timeout)
        except DatabaseUnavailable:
            raise  # already waited all of its timeout
        except Exception:  # noqa: BLE001 - any error of the race; the second try raises it for real
            # Two processes creating the tables at once: the loser's CREATE can
            # fail on some databases even with IF NOT EXISTS. Once more settles it.
            self._db.transaction(upgrade, timeout=self.timeout)
        return found

    # -- one job -------------------------------------------------------------------

    def status(self, job_id: str) -> JobStatus | None:
        """The job's record (any queue's), or None: unknown, or finished more than its keep_result ago."""
        rows = self._run(self._sql(queries.STATUS), (job_id, job_id))
        return status_from_row(job_id, rows[0]) if rows else None

    def cancel(self, job_id: str) -> str | None:
        """Cancel the job: ``"ended"`` if it waited (it is cancelled now), ``"requested"`` if a worker holds it.

        A worker's heartbeat sees the request and cancels its run. None when
        there is no such unfinished job. Waiting, then running: a
        job that moved between the two updates is looked at once more.
        """
        for _ in range(2):
            if self._run(self._sql(queries.CANCEL_WAITING), (job_id,), rows=False):
                return "ended"
            if self._run(self._sql(queries.CANCEL_RUNNING), (job_id,), rows=False):
                return "requested"
        return None

    def holder(self, job_id: str) -> tuple[str, str | None] | None:
        """``(lease_owner, lease_token)`` of a job a worker holds; None if none does."""
        rows = self._run(self._sql(queries.HOLDER), (job_id,))
        if not rows or rows[0][0] is None:
            return None
        owner, token = rows[0]
        return str(owner), None if token is None else str(token)

    # -- stats -------------------------------------------------------------------

    def stats(self) -> Stats:
        counts = self._counts()
        for queue, done in self._run(self._sql(queries.STATS_DONE), (int(time.time()) - 60,)):
            counts.setdefault(str(queue), {})["done_last_minute"] = int(done or 0)
        workers = [
            WorkerInfo(str(id_), str(queue), str(host), int(pid), int(threads), float(up), max(0.0, float(age)))
            for id_, queue, host, pid, threads, up, age in self._run(self._sql(queries.STATS_WORKERS), ())
        ]
        for worker in workers:
            counts.setdefault(worker.queue, {})
        queues = [QueueCounts(queue, **counts[queue]) for queue in sorted(counts)]
        return Stats(queues, workers, self.schedules())

    def counts(self) -> list[QueueCounts]:
        """Each queue's jobs by state, now (those that have any), in one query; ``done_last_minute`` is not read."""
        counts = self._counts()
        return [QueueCounts(queue, **counts[queue]) for queue in sorted(counts)]

    def _counts(self) -> dict[str, dict[str, Any]]:
        counts: dict[str, dict[str, Any]] = {}
        for queue, state, later, count, oldest in self._run(self._sql(queries.STATS_JOBS), ()):
            entry = counts.setdefault(str(queue), {})
            # A row claimed ahead of its run ('claimed') is one of a worker's, as 'running' is.
            key = "parked" if state == "queued" and int(later) else "running" if state == "claimed" else str(state)
            if key in ("queued", "running", "parked", "dead"):
                entry[key] = entry.get(key, 0) + int(count)
            if oldest is not None and key == "queued":
                entry["oldest_queued_age"] = max(0.0, float(oldest))
        return counts

    def jobs(
        self, *, state: str | None = None, name: str | None = None, queue: str | None = None, limit: int = 50
    ) -> list[JobStatus]:
        """The newest jobs (unfinished, dead, cancelled, and done ones whose record is kept), filtered; newest first.

        ``state`` is one of :data:`JOB_STATES` (None: any), as ``status()`` reports it.
        """
        if state not in JOB_STATES:
            raise ValueError(f"state must be one of {', '.join(s for s in JOB_STATES if s)}, got {state!r}")
        on_jobs, on_results = JOB_STATES[state]
        extra = (" AND name = ?" if name is not None else "") + (" AND queue = ?" if queue is not None else "")
        template = queries.JOBS_LIST.replace("{filter}", on_jobs + extra).replace("{result_filter}", on_results + extra)
        given = tuple(value for value in (name, queue) if value is not None)
        rows = self._run(self._db.dialect.sql(template, self.table), (*given, *given, limit))
        return [status_from_row(str(row[0]), row[1:]) for row in rows]

    def done_per_minute(self, *, minutes: int = 60, queue: str | None = None) -> list[int]:
        """Jobs done in each of the last ``minutes`` minutes (the current one last), of one queue or all.

        By this process's clock, as the workers count them; kept an hour.
        """
        now = int(time.time())
        first = (now // 60 - minutes + 1) * 60
        per_minute = [0] * minutes
        rows = self._run(self._sql(queries.DONE_SINCE, queue), _with_queue((first,), queue))
        for bucket, done in rows:
            slot = (int(bucket) - first) // 60
            if 0 <= slot < minutes:
                per_minute[slot] += int(done or 0)
        return per_minute

    def limits(self) -> list[LimitRow]:
        """Every limit key in use (a key no job needs is forgotten by its queue's housekeeping), by queue."""
        return [
            LimitRow(
                str(queue),
                str(key),
                None if running is None else int(running),
                None if name is None else str(name),
                int(held or 0),
                int(waiting or 0),
                int(booked or 0),
                float(next_in),
            )
            for queue, key, running, name, held, waiting, booked, next_in in self._run(
                self._sql(queries.LIMITS_LIST), ()
            )
        ]

    def schedules(self, *, queue: str | None = None) -> list[ScheduleRow]:
        """The periodic jobs' schedules recorded (by the processes that ran them), of one queue or all."""
        rows = self._run(self._sql(queries.SCHEDULES_LIST, queue), _with_queue((), queue))
        found = []
        for queue_name, name, text, last, following, now in rows:
            last_slot = None if last is None else float(last)
            age = None if last_slot is None else float(now) - last_slot
            found.append(
                ScheduleRow(
                    str(queue_name),
                    str(name),
                    str(text),
                    last_slot,
                    float(following),
                    age,
                    float(following) - float(now),
                )
            )
        return found

    # -- dead letters --------------------------------------------------------------

    def dead_letters(self, *, queue: str | None = None, limit: int = 100) -> list[DeadRow]:
        """Dead letters, oldest first."""
        sql = self._sql(queries.DEAD_LIST, queue)
        return [_dead_row(row) for row in self._run(sql, (*_with_queue((), queue), limit))]

    def dead_letter(self, job_id: str, *, queue: str | None = None) -> DeadRow | None:
        rows = self._run(self._sql(queries.DEAD_SHOW, queue), _with_queue((job_id,), queue))
        return _dead_row(rows[0]) if rows else None

    def retry(self, job_ids: Iterable[str], *, queue: str | None = None) -> list[str]:
        """Queue these dead letters again with fresh attempts; returns the ids that were dead letters."""
        sql = self._sql(queries.RETRY_DEAD, queue)
        retried = [job_id for job_id in job_ids if self._run(sql, _with_queue((job_id,), queue), rows=False)]
        if retried:
            self._on_requeue()
        return retried

    def retry_all(self, *, queue: str | None = None) -> int:
        count: int = self._run(self._sql(queries.RETRY_DEAD_ALL, queue), _with_queue((), queue), rows=False)
        return count

    def purge(self, *, older_than: float = 0.0, queue: str | None = None) -> int:
        """Delete dead letters that died at least ``older_than`` seconds ago; returns how many."""
        sql = self._sql(queries.PURGE_DEAD, queue)
        count: int = self._run(sql, _with_queue((_seconds_ago(older_than),), queue), rows=False)
        return count

    def delete_queue(self, queue: str) -> int:
        """Delete every row of ``queue``: its jobs whatever their state, their records and counts; how many jobs.

        For a queue nobody serves any more (the demo's own, once it ends):
        a worker of the queue would lose the jobs it runs.
        """

        def delete(cursor: Any) -> int:
            counts = []
            for suffix in ("", "_results", "_done", "_workers", "_schedules"):
                cursor.execute(self._sql(queries.DELETE_QUEUE).replace("{suffix}", suffix), (queue,))
                counts.append(int(cursor.rowcount))
            return counts[0]  # the jobs table's

        count: int = self._db.transaction(delete, timeout=self.timeout)
        return count

    def prune(self, *, cancelled_older_than: float) -> Pruned:
        """Delete what the workers of each queue delete as they go: for queues no worker serves for a while.

        Expired records of done jobs, cancelled jobs finished at least
        ``cancelled_older_than`` seconds ago, ids of jobs finished over an hour
        ago, the rows of workers whose heartbeat stopped, and counts of done
        jobs over an hour old. Dead letters stay (:meth:`purge` deletes those).
        """
        older = _seconds_ago(cancelled_older_than)
        steps = (
            (queries.RESULTS_PRUNE, ()),
            (queries.PRUNE_CANCELLED, (older,)),
            (queries.FINISHED_PRUNE, (FINISHED_KEPT,)),
            (queries.WORKERS_PRUNE, ()),
            (queries.PRUNE_DONE_COUNTS, (int(time.time()) - DONE_COUNTS_KEPT,)),
        )
        # One statement at a time, each committed on its own, as the workers do:
        # none holds its locks while the others run.
        counts = [self._run(self._sql(sql), params, rows=False) for sql, params in steps]
        keys = UniqueKeys(self._db.dialect, self.table)
        forgotten: int = self._db.run(lambda cursor: keys.prune(cursor, sweep=True), timeout=self.timeout)
        records, cancelled, finished_ids, workers, done_counts = counts
        return Pruned(records, cancelled, finished_ids, workers, done_counts, forgotten)

    def count_dead(self, *, older_than: float = 0.0, queue: str | None = None) -> int:
        """How many dead letters died at least ``older_than`` seconds ago: what ``purge()`` would delete now."""
        sql = self._sql(queries.COUNT_DEAD, queue)
        [(count,)] = self._run(sql, _with_queue((_seconds_ago(older_than),), queue))
        return int(count)


def _seconds_ago(older_than: object) -> float:
    if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) or not older_than >= 0:
        raise ValueError(f"older_than must be seconds >= 0, got {older_than!r}")
    return float(older_than)


def status_from_row(job_id: str, row: Sequence[Any]) -> JobStatus:
    """A :data:`~queries.STATUS` row as a JobStatus."""
    name, row_state, attempt, max_attempts, error, result, created, started, finished, run_at, progress, now = row[:12]
    queue, payload, priority, *rest = row[12:]
    traceback = rest[0] if rest else None  # a reader of an older row shape has none
    state: State
    if row_state in ("dead", "done", "cancelled", "running"):
        state = row_state
    elif attempt:
        state = "retrying"
    else:
        # 'claimed': in a worker's buffer, about to run. Due at WAITING_AT: waiting for its limit's permit.
        scheduled = row_state == "queued" and run_at is not None and now < run_at < WAITING_AT
        state = "scheduled" if scheduled else "queued"
    waiting = state in ("queued", "scheduled", "retrying") and (run_at is None or run_at < WAITING_AT)
    return JobStatus(
        job_id,
        name,
        state,
        int(attempt),
        int(max_attempts),
        error=error,
        result=decode_result(result),
        created_at=utc(created),
        started_at=utc(started) if state != "queued" else None,
        finished_at=utc(finished),
        run_at=utc(run_at) if waiting else None,
        progress=Progress.from_json(progress),
        queue=str(queue),
        payload=_readable(payload),
        priority=row_priority(priority),
        traceback=None if traceback is None else str(traceback),
    )


def _readable(payload: str | None) -> Any:
    """A row's payload, decoded; None for one that cannot be (a malformed row, now a dead letter)."""
    try:
        return decode_result(payload)
    except (ValueError, RecursionError):
        return None


def _with_queue(params: tuple[Any, ...], queue: str | None) -> tuple[Any, ...]:
    return params if queue is None else (*params, queue)


def _dead_row(row: Sequence[Any]) -> DeadRow:
    id_, queue, name, attempt, max_attempts, error, payload, context, created, finished, now = row
    return DeadRow(
        str(id_),
        str(queue),
        str(name),
        int(attempt),
        int(max_attempts),
        str(error or ""),
        str(payload),
        None if context is None else str(context),
        float(created),
        float(finished),
        max(0.0, float(now) - float(finished)),
    )
