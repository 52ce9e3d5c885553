"""Cancelling jobs and reporting progress: written once, run on memory, SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import tracemalloc
import uuid
from typing import Any

import pytest

import syncjobs
from syncjobs.context import RunInfo
from syncjobs.database.background import ProgressWriter
from syncjobs.errors import JobCancelled
from syncjobs.status import Progress
from tests.conftest import TEST_TABLE, Backend, QueueFactory
from tests.dbworker import WaitJob, Workers
from tests.helpers import WAIT, FakeClock, OnceJob, Probe, ProbeJob, wait_until

pytestmark = pytest.mark.timeout(60)

#: Set by a test to let a StepJob of that key go on.
STEPS: dict[str, threading.Event] = {}


@dataclasses.dataclass
class StepJob(syncjobs.Job):
    """Reports 3 of 10, waits for its step, reports 10 of 10 and returns."""

    NAME = "tests.step"
    key: str

    def run(self) -> str:
        job = syncjobs.current_job()
        assert job is not None
        job.progress(3, 10, "three")
        assert STEPS[self.key].wait(WAIT), "the test never let the job go on"
        job.progress(10, total=10, note="all")
        return "stepped"


def state_of(handle: syncjobs.JobHandle) -> str | None:
    status = handle.status()
    return None if status is None else status.state


def queue_with(make_queue: QueueFactory, **options: object) -> syncjobs.JobQueue:
    queue = make_queue(**options)
    queue.register(StepJob)
    queue.register(WaitJob)
    return queue


def test_a_queued_job_cancelled_never_runs(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=1)
    probe = Probe()
    handle = queue.dispatch(ProbeJob(probe.id))
    kept = queue.dispatch(ProbeJob(probe.id, label=1))
    assert queue.cancel(handle) is True
    status = handle.status()
    assert status is not None
    assert (status.state, status.attempts, status.finished) == ("cancelled", 0, True)
    assert status.finished_at is not None
    assert queue.pending_count() == 1
    with queue:
        assert kept.result(WAIT) is None
        assert queue.join(WAIT)
    assert [run["label"] for run in probe.runs] == [1]
    with pytest.raises(JobCancelled, match=r"'tests.probe' .* was cancelled") as cancelled:
        handle.result(WAIT)
    assert isinstance(cancelled.value, syncjobs.Cancelled)  # the Cancelled family, and an Exception
    assert isinstance(cancelled.value, Exception)
    assert queue.cancel(handle) is False  # already ended


def test_a_cancelled_job_whose_time_comes_is_dropped_and_the_queue_drains(backend: Backend) -> None:
    if backend.is_database:
        pytest.skip("a database keeps its own time; there a cancelled row is simply never claimed")
    clock = FakeClock()
    queue = backend.make(workers=1, clock=clock)
    probe = Probe("retryable", "ok", wait=60)
    parked = queue.dispatch(ProbeJob(probe.id))
    delayed = queue.dispatch(ProbeJob(probe.id, label=1), delay=30)
    with queue:
        wait_until(lambda: state_of(parked) == "retrying", what="the first run to fail")
        assert queue.cancel(parked) is True
        assert queue.cancel(delayed) is True
        # Both wait in the timer heap, cancelled: nothing left to run (once the first run is reported).
        wait_until(queue.drained, what="the queue to drain")
        assert queue.parked() == []
        clock.advance(61)  # both come due, and their claims drop them
        # One worker takes the heap's due envelopes before a job dispatched now.
        sentinel = Probe()
        assert queue.dispatch(ProbeJob(sentinel.id, label=2)).result(WAIT) is None
        assert queue.join(WAIT)
        # join() returns at the sentinel's finish; its worker reports the run a moment later.
        wait_until(queue.drained, what="the queue to drain")
    assert [run["label"] for run in probe.runs] == [0]
    assert [run["label"] for run in sentinel.runs] == [2]
    assert (state_of(parked), state_of(delayed)) == ("cancelled", "cancelled")


@pytest.mark.timeout(60)
def test_memory_lets_go_of_the_delayed_jobs_it_cancels() -> None:
    """Not only when their time comes (a delay may be days): the timers are pruned of them as cancels add up."""
    queue = syncjobs.InMemoryJobQueue(workers=0, keep_result=0)
    queue.register(ProbeJob)
    probe = Probe()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        handles = [queue.dispatch(ProbeJob(probe.id, label=i), delay=86_400) for i in range(5_000)]
        held = tracemalloc.get_traced_memory()[0] - before
        assert all(queue.cancel(handle) for handle in handles)
        del handles
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert left < held / 4, f"{held / 5_000:.0f} B a job held, {left / 5_000:.0f} B a job left after cancel"
    assert queue.parked() == []
    assert queue.pending_count() == 0
    queue.shutdown()


def test_a_job_claimed_ahead_in_this_process_and_cancelled_never_runs(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=1)
    blocker, probe = Probe("block"), Probe()
    first = queue.dispatch(ProbeJob(blocker.id))
    second = queue.dispatch(ProbeJob(probe.id))
    with queue:
        blocker.wait_runs(1)  # the one worker is busy; the second job waits (on a database, claimed ahead)
        assert queue.cancel(second) is True
        blocker.release.set()
        assert first.result(WAIT) is None
        with pytest.raises(JobCancelled):
            second.result(WAIT)
        assert queue.join(WAIT)
    assert probe.runs == []


def test_a_delayed_or_parked_job_cancelled_never_runs_again(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=1)
    probe = Probe("retryable", "ok", wait=60)
    parked = queue.dispatch(ProbeJob(probe.id))
    delayed = queue.dispatch(ProbeJob(probe.id, label=1), delay=60)
    with queue:
        wait_until(lambda: state_of(parked) == "retrying", what="the first run to fail")
        assert queue.cancel(parked) is True
        assert delayed.cancel() is True
        assert (state_of(parked), state_of(delayed)) == ("cancelled", "cancelled")
        assert queue.join(WAIT)
    assert [run["label"] for run in probe.runs] == [0]


def test_a_running_job_cancelled_gets_its_token_and_ends_cancelled(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = queue_with(make_queue, workers=1)
    letters: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(letters.append)
    reports: list[Any] = []
    queue.observe_runs(reports.append)
    probe = Probe("cooperate")
    with caplog.at_level(logging.INFO, logger="syncjobs"), queue:
        handle = queue.dispatch(OnceJob(probe.id))
        probe.wait_runs(1)
        assert handle.cancel() is True
        with pytest.raises(JobCancelled):
            handle.result(WAIT)
        assert queue.join(WAIT)
    assert probe.runs[0]["info"].cancelled.is_set()
    status = handle.status()
    assert status is not None
    assert (status.state, status.attempts) == ("cancelled", 1)
    assert len(probe.runs) == 1  # not retried
    assert letters == []  # not a dead letter
    # The log record counts the run from 1, as its run report does.
    [cancelled] = [r for r in caplog.records if r.getMessage() == f"job {OnceJob.NAME} ({handle}) cancelled"]
    assert cancelled.attempt == 1  # type: ignore[attr-defined] - the record's extra field
    assert [(r.id, r.attempt) for r in reports] == [(handle, 1)]


def test_the_warning_of_a_run_past_the_grace_counts_it_as_its_report_does(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = queue_with(make_queue, workers=1)
    reports: list[Any] = []
    queue.observe_runs(reports.append)
    blocked = Probe("block", "ok")
    with caplog.at_level(logging.INFO, logger="syncjobs"):
        queue.start()
        handle = queue.dispatch(ProbeJob(blocked.id))
        blocked.wait_runs(1)
        queue.shutdown(grace=0)
        blocked.release.set()
    still = f"job {ProbeJob.NAME} ({handle}) still running after the shutdown grace of 0.0s"
    [warning] = [r for r in caplog.records if r.getMessage().startswith(still)]
    assert warning.attempt == 1  # type: ignore[attr-defined]
    assert [(r.id, r.attempt) for r in reports] == [(handle, 1)]


def test_a_running_job_that_ignores_its_token_still_ends_cancelled(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=1)
    probe = Probe("block")
    with queue:
        handle = queue.dispatch(ProbeJob(probe.id))
        probe.wait_runs(1)
        assert queue.cancel(handle) is True
        assert probe.runs[0]["info"].cancelled.wait(WAIT)
        probe.release.set()
        with pytest.raises(JobCancelled):
            handle.result(WAIT)
    assert len(probe.runs) == 1


def test_cancel_of_an_unknown_or_finished_job_is_false(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=1)
    probe = Probe()
    assert queue.cancel(str(uuid.uuid4())) is False
    with queue:
        handle = queue.dispatch(ProbeJob(probe.id))
        handle.result(WAIT)
        assert queue.cancel(handle) is False
    assert state_of(handle) == "done"
    with pytest.raises(TypeError, match="a job id is a string, got int"):
        queue.cancel(7)  # type: ignore[arg-type]


def test_progress_shows_in_status_while_running_and_after(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=1)
    key = uuid.uuid4().hex
    STEPS[key] = threading.Event()
    try:
        handle = queue.dispatch(StepJob(key))
        assert handle.status().progress is None  # type: ignore[union-attr]
        with queue:
            wait_until(
                lambda: getattr(handle.status(), "progress", None) == Progress(3, 10, "three"),
                what="the progress to show",
            )
            assert handle.status().progress.fraction == 0.3  # type: ignore[union-attr]
            STEPS[key].set()
            assert handle.result(WAIT) == "stepped"
        done = handle.status()
        assert done is not None
        assert done.progress == Progress(10, 10, "all")
    finally:
        STEPS.pop(key).set()


def test_a_tight_loop_of_reports_costs_one_database_write_a_job_per_flush() -> None:
    published: list[Progress] = []
    info = RunInfo("job-1", "tests.step", 0, 1, report=published.append)
    for done in range(100_000):
        info.progress(done, 100_000)
    # Every report reaches the store, which keeps it as it is (the latest is never lost) ...
    assert len(published) == 100_000
    assert info.latest_progress == published[-1] == Progress(99_999, 100_000, "")

    executed: list[tuple[object, ...]] = []

    class Cursor:
        def execute(self, sql: str, params: tuple[object, ...]) -> None:
            executed.append(params)

    class Database:
        def run(self, operation: Any, *, deadline: float | None = None) -> Any:
            return operation(Cursor())

    # ... and a database's writer, which flushes once a second, writes each job's latest once.
    writer = ProgressWriter(Database(), "UPDATE", every=1.0)
    for progress in published:
        writer.put("job-1", "lease-1", progress)
    writer.put("job-2", "lease-2", Progress(1))
    assert writer.flush() == 2
    assert {params[1]: params for params in executed} == {
        "job-1": (Progress(99_999, 100_000, "").to_json(), "job-1", "lease-1"),
        "job-2": (Progress(1).to_json(), "job-2", "lease-2"),
    }
    assert len(executed) == 2
    assert writer.flush() == 0  # nothing new: nothing written


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((-1,), {}, r"done must be a number >= 0, got -1"),
        (("3",), {}, r"done must be a number >= 0, got '3'"),
        ((3,), {"total": 0}, r"total must be a number > 0 \(or None\), got 0"),
        ((3,), {"note": 5}, r"note must be a string, got int"),
        ((float("nan"),), {}, r"done must be a number >= 0, got nan"),
    ],
)
def test_bad_progress_is_refused_naming_the_job(
    args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    info = RunInfo("job-1", "tests.step", 0, 1)
    with pytest.raises((TypeError, ValueError), match=rf"job 'tests.step' \(job-1\): progress\(\): {message}"):
        info.progress(*args, **kwargs)  # type: ignore[arg-type]
    # A long note is cut, not refused: progress must never fail a run.
    info.progress(1, note="x" * 1000)
    assert info.latest_progress is not None
    assert len(info.latest_progress.note) == 200


# -- across processes, on the database -------------------------------------------


@pytest.mark.timeout(120)
def test_a_job_running_in_another_process_is_cancelled_through_the_database(db_url: str) -> None:
    name = f"q-{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, queue=name, table=TEST_TABLE, workers=0)
    queue.register(WaitJob)
    # A lease of 3 s: the worker's heartbeat, which reads cancel requests, beats every second.
    workers = Workers(db_url, name, table=TEST_TABLE, lease=3.0)
    try:
        workers.spawn()
        handle = queue.dispatch(WaitJob(seconds=60))
        queued = queue.dispatch(WaitJob(seconds=60), delay=60)
        wait_until(lambda: state_of(handle) == "running", what="the job to run in the worker")
        assert queue.cancel(handle) is True
        with pytest.raises(JobCancelled):
            handle.result(WAIT)
        status = handle.status()
        assert status is not None
        assert (status.state, status.attempts) == ("cancelled", 1)
        assert queue.cancel(queued) is True
        assert state_of(queued) == "cancelled"
        assert queue.pending_count() == 0
    finally:
        workers.stop()
        queue.shutdown(grace=0)


def test_a_flagged_row_that_goes_back_to_the_queue_or_dies_ends_cancelled(db_url: str) -> None:
    """Parked, requeued or dead-lettered before the holder's heartbeat saw the flag: cancelled all the same."""
    from syncjobs.database import queries
    from syncjobs.database.dialects import dialect_for
    from tests.test_database import execute

    queue = syncjobs.DatabaseJobQueue(db_url, queue=f"q-{uuid.uuid4().hex[:10]}", table=TEST_TABLE, workers=0)
    queue.register(WaitJob)
    try:
        parked, expired = queue.dispatch(WaitJob()), queue.dispatch(WaitJob())
        dead, dead_expired, poison = queue.dispatch(WaitJob()), queue.dispatch(WaitJob()), queue.dispatch(WaitJob())
        flagged = (parked, expired, dead, dead_expired, poison)
        claim = f"UPDATE {TEST_TABLE} SET state = 'running', lease_token = ?, lease_owner = 'elsewhere' WHERE id = ?"
        for job_id in flagged:
            execute(db_url, claim, (f"token-{job_id}", str(job_id)))
            assert queue.cancel(job_id) is True  # requested: another process holds it
            assert state_of(job_id) == "running"
        dialect = dialect_for(db_url)
        execute(
            db_url,
            dialect.sql(queries.PARK, TEST_TABLE).replace(dialect.placeholder, "?"),
            (1, 30.0, str(parked), f"token-{parked}"),
        )
        execute(
            db_url,
            dialect.sql(queries.REQUEUE_EXPIRED, TEST_TABLE).replace(dialect.placeholder, "?"),
            (1, str(expired)),
        )
        for statement, values in (
            (queries.DEAD, (1, "failed", None, str(dead), f"token-{dead}")),
            (queries.DEAD_EXPIRED, (1, "failed", str(dead_expired))),
            (queries.POISON, (1, 1, "cannot be read", str(poison), f"token-{poison}")),
        ):
            execute(db_url, dialect.sql(statement, TEST_TABLE).replace(dialect.placeholder, "?"), values)
        for job_id in flagged:
            status = queue.status(job_id)
            assert status is not None
            assert (status.state, status.finished) == ("cancelled", True)
        assert queue.pending_count() == 0
    finally:
        queue.shutdown(grace=0)
