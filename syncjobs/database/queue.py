"""``DatabaseJobQueue``: the JobQueue contract over a table, across processes and machines."""

from __future__ import annotations

import contextvars
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..envelope import DeadLetter, Envelope
from ..errors import QueueError
from ..job import Job
from ..queue import DEFAULT_SHUTDOWN_GRACE, Delay, StoreQueue, delay_seconds, new_envelope
from . import queries
from .dialects import Connector, check_identifier
from .schema import SCHEMA_VERSION, ddl
from .store import DatabaseStore

logger = logging.getLogger("syncjobs.database")


class DatabaseJobQueue(StoreQueue):
    """A durable job queue in a SQLite, PostgreSQL or MySQL/MariaDB table.

    Many processes on many machines may share one table: each row is claimed
    by one worker at a time, under a lease renewed while the job runs; the job
    of a worker that died runs again once its lease expires.
    """

    def __init__(
        self,
        url: str,
        *,
        workers: int = 4,
        queue: str = "default",
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        table: str = "syncjobs_jobs",
        carry: Iterable[contextvars.ContextVar[Any]] = (),
        auto_schema: bool = True,
        dispatch_timeout: float = 5.0,
        prefetch: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_identifier(table, "table")
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0):
            raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
        if not isinstance(queue, str) or not 0 < len(queue) <= 100 or not queue.isprintable():
            raise QueueError(f"queue name {queue!r} must be 1 to 100 printable characters")
        for value, what in ((lease, "lease"), (poll_interval, "poll_interval"), (dispatch_timeout, "dispatch_timeout")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{what} must be a number of seconds > 0, got {value!r}")
        self.url = url
        self.queue_name = queue
        self.table = table
        self.auto_schema = auto_schema
        self._schema_ready = False
        self._db = DatabaseStore(
            Connector(url),
            table=table,
            queue=queue,
            lease=float(lease),
            poll_interval=float(poll_interval),
            carry=list(carry),
            dispatch_timeout=float(dispatch_timeout),
            # One batch ahead of the workers by default, as Celery and Dramatiq
            # prefetch: a claim's round trip overlaps the runs. 0 for long jobs.
            prefetch=workers if prefetch is None else prefetch,
            clock=clock,
        )
        super().__init__(self._db, workers=workers, shutdown_grace=shutdown_grace, clock=clock)
        self._db.on_expired_dead = self._expired_dead

    # -- schema -------------------------------------------------------------

    def install_schema(self) -> None:
        """Create the table and its indexes if they are missing; safe to call again, from any process."""
        dialect = self._db.dialect

        def install(cursor: Any) -> None:
            for statement in ddl(dialect, self.table):
                cursor.execute(statement)
            cursor.execute(dialect.sql(queries.SCHEMA_VERSION, self.table))
            if cursor.fetchone() is None:
                cursor.execute(dialect.sql(queries.SET_SCHEMA_VERSION, self.table), (SCHEMA_VERSION,))

        try:
            self._db.transaction(install, deadline=self._db.dispatch_timeout)
        except Exception:  # noqa: BLE001 - any error of the race; the second try raises it for real
            # Two processes creating the table at once: the loser's CREATE can
            # fail on some databases even with IF NOT EXISTS. Once more settles it.
            self._db.transaction(install, deadline=self._db.dispatch_timeout)
        self._schema_ready = True

    def _ensure_schema(self) -> None:
        if not self._schema_ready and self.auto_schema:
            self.install_schema()

    # -- the contract, plus the database's own -------------------------------

    def start(self) -> None:
        self._ensure_schema()
        super().start()

    def dispatch(self, job: Job, *, delay: Delay = None, connection: Any = None) -> str:
        """Insert ``job``; with ``connection``, inside the caller's transaction, which the queue never commits."""
        return self.dispatch_many([job], delay=delay, connection=connection)[0]

    def dispatch_many(self, jobs: Sequence[Job], *, delay: Delay = None, connection: Any = None) -> list[str]:
        """Insert ``jobs`` in one transaction: all of them or, if anything is refused, none."""
        self._ensure_schema()
        items: list[tuple[Envelope, float]] = []
        for job in jobs:
            envelope = new_envelope(self._registry, job)
            items.append((envelope, delay_seconds(envelope.name, delay)))
            self._db.carried(envelope.context)  # refuse a carried value that is not JSON, before any insert
        if items:
            self._db.put_many(items, connection)
        return [envelope.id for envelope, _ in items]

    def pending_count(self) -> int:
        self._ensure_schema()
        return super().pending_count()

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """This queue's dead letters, oldest first."""
        self._ensure_schema()

        def fetch(cursor: Any) -> list[DeadLetter]:
            cursor.execute(self._db.dialect.sql(queries.DEAD_LETTERS, self.table), (self.queue_name, limit))
            letters = []
            for job_id, name, payload, attempts, error in cursor.fetchall():
                try:
                    data = json.loads(payload)
                except ValueError:
                    data = {}
                letters.append(
                    DeadLetter(
                        str(job_id), str(name), data if isinstance(data, dict) else {}, int(attempts), str(error or "")
                    )
                )
            return letters

        return self._db.run(fetch)

    def retry_dead(self, job_id: str) -> bool:
        """Queue a dead letter again with fresh attempts; False if there is no such dead letter."""
        self._ensure_schema()

        def retry(cursor: Any) -> bool:
            cursor.execute(self._db.dialect.sql(queries.RETRY_DEAD, self.table), (job_id, self.queue_name))
            return bool(cursor.rowcount)

        retried = self._db.run(retry)
        self._db._kick.set()
        return retried

    def purge_dead(self, older_than: float = 0.0) -> int:
        """Delete this queue's dead letters (those dead at least ``older_than`` seconds); returns how many."""
        self._ensure_schema()

        def purge(cursor: Any) -> int:
            cursor.execute(self._db.dialect.sql(queries.PURGE_DEAD, self.table), (self.queue_name, older_than))
            return int(cursor.rowcount)

        return self._db.run(purge)

    def _expired_dead(self, envelope: Envelope, error: str) -> None:
        try:
            payload = json.loads(envelope.payload)
        except ValueError:
            payload = {}
        dead = DeadLetter(
            envelope.id, envelope.name, payload if isinstance(payload, dict) else {}, envelope.attempt, error
        )
        self._dead_letters.emit(dead, envelope.context)


#: The historical name; not PostgreSQL-only.
PgJobQueue = DatabaseJobQueue
