"""Jobs dispatched one by one in a stream come in one claim, not a claim each."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from tests.helpers import WAIT, wait_until
from tests.test_claim_floor import _Connection, fetcher_on
from tests.test_database import drop_tables, execute, install_tables

T = TypeVar("T")


class _CountingCursor:
    def __init__(self, cursor: Any, claims: list[int]) -> None:
        self._cursor = cursor
        self._claims = claims

    def execute(self, sql: str, params: Any = ()) -> Any:
        result = self._cursor.execute(sql, params)
        if "run_at LIMIT" in sql and "UPDATE" in sql:  # a claim (UPDATE ... RETURNING), from the start or a floor
            self._claims.append(1)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _CountingConnection(_Connection):
    """Counts the claims the fetcher runs through it (SQLite: one UPDATE … RETURNING each)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.claims: list[int] = []

    def run(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        return super().run(lambda cursor: operation(_CountingCursor(cursor, self.claims)), deadline=deadline)

    def transaction(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        return super().transaction(lambda cursor: operation(_CountingCursor(cursor, self.claims)), deadline=deadline)


class _Queue:
    """A SQLite queue table, a fetcher's loop running over it in its own thread, and a way to add rows."""

    def __init__(self, tmp_path: Any, **options: Any) -> None:
        self.url = f"sqlite:///{tmp_path / 'jobs.db'}"
        self.table = f"fetch_{uuid.uuid4().hex[:8]}"
        install_tables(self.url, self.table)
        self.runner = _CountingConnection(self.url)
        self.fetcher = fetcher_on(self.runner, self.table, poll_interval=600.0, **options)
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self.fetcher.loop, args=(self._stop,), name="test-fetcher")

    def insert(self, job_id: str) -> None:
        execute(
            self.url,
            f"INSERT INTO {self.table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "VALUES (?, 'default', 'tests.probe', '{}', 'queued', 0, 3, 1.0, 1.0)",
            (job_id,),
        )

    def insert_many(self, job_ids: list[str]) -> None:
        """In one statement: the rows of a fast stream."""
        marks = ", ".join("(?, 'default', 'tests.probe', '{}', 'queued', 0, 3, 1.0, 1.0)" for _ in job_ids)
        execute(
            self.url,
            f"INSERT INTO {self.table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            f"VALUES {marks}",
            tuple(job_ids),
        )

    def state(self, job_id: str) -> str:
        return str(execute(self.url, f"SELECT state FROM {self.table} WHERE id = ?", (job_id,))[0][0])


@contextlib.contextmanager
def fetching(tmp_path: Any, **options: Any) -> Iterator[_Queue]:
    queue = _Queue(tmp_path, **options)
    queue._loop.start()
    try:
        yield queue
    finally:
        queue._stop.set()
        queue.fetcher.stop()
        queue.fetcher.wake(1)
        queue._loop.join(WAIT)
        queue.runner.conn.close()
        drop_tables(queue.url, queue.table)
    assert not queue._loop.is_alive()


@pytest.mark.timeout(60)
def test_jobs_that_come_during_the_rest_after_a_claim_come_in_one_claim(tmp_path: Any) -> None:
    with fetching(tmp_path, prefetch=20, coalesce=0.5) as queue:
        queue.insert("job-first")
        queue.fetcher.kick()
        first = queue.fetcher.take()
        assert first is not None
        assert first.id == "job-first"
        claims_before = len(queue.runner.claims)
        for i in range(10):  # a stream: each one kicks, all within the rest of 0.5 s
            queue.insert(f"job-{i}")
            queue.fetcher.kick()
        taken = [queue.fetcher.take() for _ in range(10)]
        assert sorted(e.id for e in taken if e is not None) == sorted(f"job-{i}" for i in range(10))
        assert len(queue.runner.claims) - claims_before == 1, queue.runner.claims


@pytest.mark.timeout(60)
def test_a_run_taken_while_the_fetcher_rests_is_marked_running_in_time(tmp_path: Any) -> None:
    # The fetcher rests after a short claim (prefetch 2, one row); a worker
    # takes the claimed row during that rest, and its run must still be
    # marked within about mark_after, not at the next poll (600 s here).
    with fetching(tmp_path, prefetch=2) as queue:
        queue.insert("job-slow")
        queue.fetcher.kick()
        wait_until(lambda: queue.state("job-slow") == "claimed", what="the claim, ahead of any worker")
        assert queue.fetcher.take() is not None  # its run goes on: no outcome is written
        wait_until(lambda: queue.state("job-slow") == "running", timeout=5.0, what="the mark of the run")


def _take_ids(queue: _Queue, count: int) -> list[str]:
    taken = [queue.fetcher.take() for _ in range(count)]
    return sorted(envelope.id for envelope in taken if envelope is not None)


def _claims_found(records: list[logging.LogRecord]) -> list[int]:
    """The rows each claim that came back short found, from the fetcher's DEBUG records."""
    return [int(record.args[0]) for record in records if record.msg.startswith("%d job(s) ready")]  # type: ignore[index]


@pytest.mark.timeout(60)
def test_while_jobs_stream_in_fast_a_wake_up_waits_the_stream_window(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.DEBUG, "syncjobs.database"),
        fetching(tmp_path, prefetch=200, coalesce=0.0, stream_coalesce=0.5) as queue,
    ):
        queue.fetcher.mark_after = 600.0  # the taken runs never end: their marks would be claims of their own
        for batch in ("a", "b"):  # the second 50 rows some milliseconds after the first: thousands a second
            ids = [f"job-{batch}-{i}" for i in range(50)]
            queue.insert_many(ids)
            queue.fetcher.kick()
            assert _take_ids(queue, 50) == sorted(ids)
        caplog.clear()
        for i in range(5):  # all within the stream window of 0.5 s after the last claim
            queue.insert(f"job-c-{i}")
            queue.fetcher.kick()
        assert _take_ids(queue, 5) == sorted(f"job-c-{i}" for i in range(5))
        # The claim logs what it found just after handing the rows over.
        wait_until(lambda: any(0 < count < 50 for count in _claims_found(caplog.records)), what="the claim's record")
        found = _claims_found(caplog.records)  # may also hold the second batch's 50, and empty claims after
        assert 5 in found, found
        assert not [count for count in found if 0 < count < 5], found


@pytest.mark.timeout(60)
def test_jobs_that_come_in_pairs_now_and_then_do_not_wait_the_stream_window(tmp_path: Any) -> None:
    # A stream window longer than the test: a job that waited it would time the test out. Two jobs
    # a few milliseconds apart are no stream (a rate taken from one claim saw thousands a second).
    with fetching(tmp_path, prefetch=20, coalesce=0.0, stream_coalesce=600.0) as queue:
        for pair in range(5):
            ids = [f"job-{pair}-a", f"job-{pair}-b"]
            queue.insert_many(ids)
            queue.fetcher.kick()
            assert _take_ids(queue, 2) == ids
