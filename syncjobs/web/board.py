"""What the dashboard reads and changes: a jobs table, through its admin.

The pages know only :class:`Board`; :class:`TableBoard` is it for a database's
jobs table (every queue in it), on the admin's own connections.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Protocol

from ..database.admin import JOB_STATES, ScheduleRow, TableAdmin, WorkerInfo
from ..limits import LimitRow
from ..status import JobStatus, QueueCounts

#: The states a job list can be filtered by, in the order a job moves through them; then the
#: overview's own two: ready (now, whatever the attempt) and parked (a delay, a backoff, a limit).
STATES = tuple(state for state in JOB_STATES if state is not None)


@dataclasses.dataclass(frozen=True)
class Overview:
    """Each queue's counts, jobs done per minute over the last hour (the current minute last), the live workers."""

    queues: list[QueueCounts]
    done_per_minute: list[int]
    workers: list[WorkerInfo]


class Board(Protocol):
    """The reads and actions the dashboard offers, on one jobs table."""

    #: What the dashboard shows (the database, its URL masked, and the table).
    description: str

    def overview(self) -> Overview: ...

    def jobs(
        self, *, state: str | None = None, name: str | None = None, queue: str | None = None, limit: int = 100
    ) -> list[JobStatus]: ...

    def job(self, job_id: str) -> JobStatus | None: ...

    def retry(self, job_id: str) -> bool:
        """Queue a dead job again with fresh attempts; False when it is not a dead letter."""
        ...

    def cancel(self, job_id: str) -> Literal["ended", "requested"] | None: ...

    def count_dead(self, queue: str) -> int: ...

    def purge(self, queue: str) -> int:
        """Delete the queue's dead letters; how many."""
        ...

    def schedules(self) -> list[ScheduleRow]: ...

    def limits(self) -> list[LimitRow]: ...

    def queue_names(self) -> list[str]:
        """The queues that have jobs now (for the job list's filter)."""
        ...


class TableBoard:
    """A :class:`Board` on a database's jobs table, through a :class:`TableAdmin`.

    ``owned``: the admin's connections are the board's own, which :meth:`close`
    closes (not a queue's, which the queue closes).
    """

    def __init__(self, admin: TableAdmin, description: str, *, owned: bool = True) -> None:
        self._admin = admin
        self.description = description
        self._owned = owned

    def close(self) -> None:
        if self._owned:
            self._admin.close()

    def overview(self) -> Overview:
        stats = self._admin.stats()
        return Overview(stats.queues, self._admin.done_per_minute(), stats.workers)

    def jobs(
        self, *, state: str | None = None, name: str | None = None, queue: str | None = None, limit: int = 100
    ) -> list[JobStatus]:
        return self._admin.jobs(state=state, name=name, queue=queue, limit=limit)

    def job(self, job_id: str) -> JobStatus | None:
        return self._admin.status(job_id)

    def retry(self, job_id: str) -> bool:
        return bool(self._admin.retry([job_id]))

    def cancel(self, job_id: str) -> Literal["ended", "requested"] | None:
        found = self._admin.cancel(job_id)
        return "ended" if found == "ended" else "requested" if found == "requested" else None

    def count_dead(self, queue: str) -> int:
        return self._admin.count_dead(queue=queue)

    def purge(self, queue: str) -> int:
        return self._admin.purge(queue=queue)

    def schedules(self) -> list[ScheduleRow]:
        return self._admin.schedules()

    def limits(self) -> list[LimitRow]:
        return self._admin.limits()

    def queue_names(self) -> list[str]:
        return [counts.queue for counts in self._admin.counts()]
