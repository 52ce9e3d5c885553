"""Each schedule's last slot dispatched, in ``<table>_schedules``: where a restarted process resumes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from . import queries
from .dialects import MYSQL


class DatabaseRecords:
    """The :class:`~syncjobs.scheduler.ScheduleRecords` of one queue of a table."""

    def __init__(self, run: Any, dialect: Any, table: str, queue: str) -> None:
        #: ``run(operation)``: the store's, retrying through outages.
        self._run = run
        self._queue = queue
        self._last = dialect.sql(queries.SCHEDULES_LAST, table)
        mysql = dialect is MYSQL
        self._record = dialect.sql(queries.SCHEDULE_RECORD_MYSQL if mysql else queries.SCHEDULE_RECORD, table)
        self._announce = dialect.sql(queries.SCHEDULE_ANNOUNCE_MYSQL if mysql else queries.SCHEDULE_ANNOUNCE, table)

    def last_slots(self) -> dict[str, float]:
        def read(cursor: Any) -> dict[str, float]:
            cursor.execute(self._last, (self._queue,))
            return {str(name): float(last) for name, last in cursor.fetchall()}

        found: dict[str, float] = self._run(read)
        return found

    def record(self, name: str, description: str, last: float, following: float) -> None:
        def write(cursor: Any) -> None:
            cursor.execute(self._record, (self._key(name), self._queue, name, description[:255], last, following))

        self._run(write)

    def announce(self, name: str, description: str, following: float) -> None:
        def write(cursor: Any) -> None:
            cursor.execute(self._announce, (self._key(name), self._queue, name, description[:255], following))

        self._run(write)

    def _key(self, name: str) -> str:
        return hashlib.sha256(json.dumps([self._queue, name]).encode()).hexdigest()
