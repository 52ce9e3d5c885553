"""Handles, status and results: written once, run on memory, SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import sys
import threading
import time
import uuid
from typing import Any, ClassVar

import pytest

import syncjobs
from syncjobs.database.schema import SCHEMA_VERSION
from syncjobs.errors import JobFailed, JobNotFound
from syncjobs.status import JobHandle
from tests.conftest import TEST_TABLE, Backend, QueueFactory
from tests.dbworker import SumJob, Workers
from tests.helpers import WAIT, FakeClock, OnceJob, Probe, ProbeJob, wait_until

pytestmark = pytest.mark.timeout(60)

# The database's clock and this process's may differ by a little (and the
# database stores times as floating seconds).
SKEW = datetime.timedelta(seconds=2)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class TimedOnceJob(ProbeJob):
    NAME = "tests.status_timed"
    MAX_ATTEMPTS = 1
    TIMEOUT = 0.3


@dataclasses.dataclass
class ReturnsJob(syncjobs.Job):
    """Returns ``value`` as it is: a set is not JSON."""

    NAME = "tests.returns"
    MAX_ATTEMPTS = 3
    KEEP_RESULT: ClassVar[float | None] = None
    kind: str

    def run(self) -> Any:
        return {"set": {1, 2}, "tuple": (1, 2), "none": None, "broken": Unlistable(a=1)}[self.kind]


class Unlistable(dict):  # type: ignore[type-arg]
    """A dict whose items cannot be read: what json.dumps raises then is not a TypeError."""

    def items(self) -> Any:
        raise KeyError("gone")


def queue_with(make_queue: QueueFactory, **options: Any) -> Any:
    queue = make_queue(**options)
    for job_cls in (SumJob, TimedOnceJob, ReturnsJob):
        queue.register(job_cls)
    return queue


def test_dispatch_returns_a_handle_that_is_the_jobs_id(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=0)
    handle = queue.dispatch(SumJob([1]))
    assert isinstance(handle, JobHandle)
    assert isinstance(handle, str)
    assert handle == handle.id == str(handle)
    assert {handle: 1}[str(handle)] == 1
    assert json.dumps({"id": handle}) == json.dumps({"id": str(handle)})
    for copied in (copy.copy(handle), copy.deepcopy(handle)):
        assert type(copied) is str  # what a cache or a session pickles, too: no queue inside
        assert copied == handle
    # The handle and a plain copy of the id find the same record.
    assert queue.status(copied) == handle.status()
    assert repr(handle) == f"JobHandle({str(handle)!r})"


def test_a_job_is_queued_then_running_then_done_with_its_result(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=1)
    probe = Probe("block")
    before = now()
    blocked = queue.dispatch(ProbeJob(probe.id))
    summed = queue.dispatch(SumJob([1, 2, 3]))
    queued = summed.status()
    assert queued is not None
    assert (queued.id, queued.name, queued.state, queued.attempts) == (summed, "tests.sum", "queued", 0)
    assert queued.max_attempts == SumJob.MAX_ATTEMPTS
    assert queued.created_at is not None
    assert before - SKEW <= queued.created_at <= now() + SKEW
    assert (queued.started_at, queued.finished_at, queued.result, queued.finished) == (None, None, None, False)
    assert queued.payload == {"numbers": [1, 2, 3]}
    assert queued.queue == getattr(queue, "queue_name", None), "a database queue's name; in memory, none"
    with queue:
        probe.wait_runs(1)
        # A database marks a run begun from a prefetched row a moment after it begins.
        wait_until(lambda: getattr(blocked.status(), "state", None) == "running", what="the run to show")
        running = blocked.status()
        assert running is not None
        assert (running.state, running.attempts, running.finished) == ("running", 0, False)
        assert running.started_at is not None
        assert before - SKEW <= running.started_at <= now() + SKEW
        probe.release.set()
        assert summed.result(WAIT) == {"sum": 6}
        assert blocked.result(WAIT) is None
    done = summed.status()
    assert done is not None
    assert (done.state, done.attempts, done.result, done.error, done.finished) == ("done", 1, {"sum": 6}, None, True)
    assert done.payload == {"numbers": [1, 2, 3]}, "a done job's record says what it was asked"
    assert done.started_at is not None
    assert done.finished_at is not None
    assert done.created_at is not None
    assert done.created_at - SKEW <= done.started_at <= done.finished_at <= now() + SKEW


def test_a_delayed_job_is_scheduled_until_its_time(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=0)
    handle = queue.dispatch(SumJob([1]), delay=60)
    status = handle.status()
    assert status is not None
    assert status.state == "scheduled"
    assert status.run_at is not None
    assert (
        now() + datetime.timedelta(seconds=60) - SKEW <= status.run_at <= now() + datetime.timedelta(seconds=60) + SKEW
    )
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"'tests.sum' .* has not finished after 0.2s: it is scheduled"):
        handle.result(timeout=0.2)
    assert time.monotonic() - began < 5


def test_a_failed_run_shows_the_job_retrying_with_its_runs_spent(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=1)
    probe = Probe("retryable", "ok", wait=60)
    handle = queue.dispatch(ProbeJob(probe.id))
    with queue:
        wait_until(lambda: getattr(handle.status(), "state", None) == "retrying", what="the job to be retrying")
    status = handle.status()
    assert status is not None
    assert (status.state, status.attempts, status.finished) == ("retrying", 1, False)
    assert status.run_at is not None
    assert status.run_at > now() + datetime.timedelta(seconds=30)


def test_the_result_of_a_dead_job_raises_job_failed_with_its_error(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue)
    probe = Probe("crash")
    with queue:
        handle = queue.dispatch(OnceJob(probe.id))
        with pytest.raises(JobFailed, match=r"'tests.once' .* is dead after 1 of 1 runs: job raised ValueError: boom"):
            handle.result(WAIT)
        with pytest.raises(JobFailed) as failed:
            queue.result(handle, WAIT)
    status = failed.value.status
    assert isinstance(status, syncjobs.JobStatus)
    assert (status.state, status.attempts, status.error, status.finished) == (
        "dead",
        1,
        "job raised ValueError: boom",
        True,
    )
    assert status.finished_at is not None


def test_a_dead_job_keeps_where_its_last_run_raised_and_a_retry_forgets_it(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue)
    crashed, fatal = Probe("crash"), Probe("fatal")
    with queue:
        crash_id = queue.dispatch(OnceJob(crashed.id))
        fatal_id = queue.dispatch(OnceJob(fatal.id))
        wait_until(
            lambda: all(getattr(queue.status(j), "state", None) == "dead" for j in (crash_id, fatal_id)),
            what="both dead",
        )
        status = queue.status(crash_id)
        assert status is not None
        assert status.error == "job raised ValueError: boom"  # the reason stays one line
        assert status.traceback is not None
        assert status.traceback.startswith("Traceback (most recent call last):\n")
        assert status.traceback.rstrip().endswith("ValueError: boom")
        assert "helpers.py" in status.traceback  # where the job raised
        # A job that gave up by its own Fatal says why in its error: no traceback.
        fatal_status = queue.status(fatal_id)
        assert fatal_status is not None
        assert fatal_status.error is not None
        assert fatal_status.traceback is None
        # Queued again, the job is as new: its next runs write their own.
        assert queue.retry_dead(crash_id)
        wait_until(lambda: getattr(queue.status(crash_id), "state", None) == "dead", what="dead again")
        again = queue.status(crash_id)
        assert again is not None
        assert again.traceback is not None
        assert again.traceback.count("Traceback (most recent call last)") == 1


def test_the_result_of_a_timed_out_job_says_it_timed_out(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue)
    probe = Probe("block")
    try:
        with queue:
            handle = queue.dispatch(TimedOnceJob(probe.id))
            with pytest.raises(JobFailed, match=r"dead after 1 of 1 runs: timed out after 0.3s"):
                handle.result(WAIT)
    finally:
        probe.release.set()


def test_a_result_that_cannot_be_kept_leaves_the_job_done_and_says_why(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = queue_with(make_queue)
    letters: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(letters.append)
    with queue:
        bad = queue.dispatch(ReturnsJob("set"))
        # Its work is done, and a rerun would return the same: done, with no result.
        assert bad.result(WAIT) is None
        broken = queue.dispatch(ReturnsJob("broken"))  # json.dumps calls the value's own, failing, code
        assert broken.result(WAIT) is None
        # A tuple comes back a list.
        assert queue.dispatch(ReturnsJob("tuple")).result(WAIT) == [1, 2]
        assert queue.dispatch(ReturnsJob("none")).result(WAIT) is None
        assert queue.join(WAIT)
    assert (bad.status().state, broken.status().state) == ("done", "done")  # type: ignore[union-attr]
    assert letters == []
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        f"job tests.returns ({bad}) is done, but its result is not kept: it returned a value that is not JSON: "
        "TypeError: Object of type set is not JSON serializable" in message
        for message in warnings
    ), warnings
    assert any(f"({broken}) is done, but its result is not kept" in message for message in warnings), warnings


def test_an_unknown_job_has_no_status_and_its_result_says_so(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, workers=0)
    missing = str(uuid.uuid4())
    assert queue.status(missing) is None
    with pytest.raises(JobNotFound, match=rf"job {missing}: no record of it"):
        queue.result(missing, timeout=1)
    with pytest.raises(TypeError, match="a job id is a string, got int"):
        queue.status(42)
    with pytest.raises(ValueError, match="timeout must be seconds >= 0"):
        queue.result(missing, timeout=-1)


def test_with_keep_result_zero_a_done_job_leaves_no_record(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, keep_result=0)
    assert queue.keep_result == 0
    with queue:
        handle = queue.dispatch(SumJob([2]))
        assert queue.join(WAIT)
    assert handle.status() is None
    with pytest.raises(JobNotFound):
        handle.result(0)


def test_waiting_for_a_job_whose_record_is_not_kept_ends_when_it_finishes(
    make_queue: QueueFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen running, then gone: JobNotFound at once, not after the grace that a job not yet committed gets."""
    queue = queue_with(make_queue, keep_result=0, workers=1)
    probe = Probe("block")
    outcome: list[BaseException] = []
    seen = threading.Event()
    status = queue.status

    def looked(job_id: str) -> syncjobs.JobStatus | None:
        found = status(job_id)
        if found is not None:
            seen.set()
        return found

    monkeypatch.setattr(queue, "status", looked)

    def wait() -> None:
        try:
            handle.result(None)
        except BaseException as exc:  # noqa: BLE001 - recorded for the test to check
            outcome.append(exc)

    with queue:
        handle = queue.dispatch(ProbeJob(probe.id))
        probe.wait_runs(1)
        waiter = threading.Thread(target=wait)
        waiter.start()
        assert seen.wait(WAIT), "the waiter saw the job running"
        probe.release.set()
        waiter.join(WAIT)  # well within the 30 s an unseen young id is waited for
        assert not waiter.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], JobNotFound)


def test_a_jobs_own_keep_result_beats_the_queues(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue, keep_result=0)

    class Kept(SumJob):
        NAME = "tests.sum_kept"
        KEEP_RESULT = 600

    class KeptAlso(SumJob):
        NAME = "tests.sum_kept_also"
        KEEP_RESULT = 600.5

    queue.register(Kept)
    queue.register(KeptAlso)
    assert Kept.KEEP_RESULT == 600.0
    assert isinstance(Kept.KEEP_RESULT, float)
    # Dispatched before start: claimed and completed together, one batch with an
    # int-born and a float keep, and one kept not at all.
    kept = [queue.dispatch(job) for job in (Kept([4]), KeptAlso([5]), SumJob([6]), Kept([7]))]
    with queue:
        assert [handle.result(WAIT) if i != 2 else None for i, handle in enumerate(kept)] == [
            {"sum": 4},
            {"sum": 5},
            None,
            {"sum": 7},
        ]
        assert queue.join(WAIT)
    assert kept[2].status() is None


def test_a_done_jobs_record_goes_once_its_keep_result_has_passed(backend: Backend) -> None:
    if backend.is_database:
        pytest.skip("a database keeps its own time: see test_the_workers_prune_expired_results_from_the_database")
    clock = FakeClock()
    queue = backend.make(clock=clock, keep_result=10)
    queue.register(SumJob)
    with queue:
        first = queue.dispatch(SumJob([1]))
        assert first.result(WAIT) == {"sum": 1}
        clock.advance(9)
        assert first.status() is not None
        clock.advance(2)
        assert first.status() is None
        with pytest.raises(JobNotFound):
            first.result(0)
        assert queue.kept_records() == 1  # expired, not yet pruned
        # A later finish prunes it; the later job's record stays.
        second = queue.dispatch(SumJob([2]))
        assert second.result(WAIT) == {"sum": 2}
        assert first.status() is None
        assert queue.kept_records() == 1


def test_memory_keeps_at_most_max_records_the_soonest_to_expire_going_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(syncjobs.memory, "MAX_RECORDS", 3)
    queue = syncjobs.InMemoryJobQueue(workers=1, keep_result=600)
    queue.register(SumJob)
    with queue:
        handles = [queue.dispatch(SumJob([n])) for n in range(6)]
        assert handles[-1].result(WAIT) == {"sum": 5}
        assert queue.join(WAIT)
    assert queue.kept_records() == 3
    assert [handle.status() is not None for handle in handles] == [False, False, False, True, True, True]


class BrieflyKept(SumJob):
    NAME = "tests.sum_briefly_kept"
    KEEP_RESULT = 10


def test_memory_prunes_the_records_of_each_keep_as_theirs_expire() -> None:
    clock = FakeClock()
    queue = syncjobs.InMemoryJobQueue(workers=1, keep_result=600, clock=clock)
    queue.register(SumJob)
    queue.register(BrieflyKept)
    with queue:
        long_kept = queue.dispatch(SumJob([1]))
        briefly = [queue.dispatch(BrieflyKept([n])) for n in range(3)]
        dead = queue.dispatch(SumJob([-1]))  # a dead letter: kept 600 s too
        assert queue.join(WAIT)
        assert queue.kept_records() == 5
        clock.advance(11)
        # Written after the long-kept one, expiring long before it: a finish prunes them all the same.
        assert queue.dispatch(SumJob([2])).result(WAIT) == {"sum": 2}
        assert [handle.status() for handle in briefly] == [None, None, None]
        assert queue.kept_records() == 3
        later = queue.dispatch(BrieflyKept([4]))
        assert later.result(WAIT) == {"sum": 4}
        clock.advance(590)  # the first long-kept record and the dead letter expire, the brief one long since
        assert queue.dispatch(BrieflyKept([5])).result(WAIT) == {"sum": 5}
        assert long_kept.status() is None
        assert dead.status() is None
        assert later.status() is None
        assert queue.kept_records() == 2  # SumJob([2]) (600 s from 11 s) and the last brief one


def test_a_dead_letter_retried_and_dead_again_holds_up_no_prune(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(syncjobs.memory, "MAX_RECORDS", 4)
    clock = FakeClock()
    queue = syncjobs.InMemoryJobQueue(workers=1, keep_result=600, clock=clock)
    queue.register(SumJob)
    with queue:
        dead = queue.dispatch(SumJob([-1]))
        assert queue.join(WAIT)
        done = [queue.dispatch(SumJob([n])) for n in range(3)]
        assert queue.join(WAIT)
        clock.advance(500)
        assert queue.retry_dead(dead)
        assert queue.join(WAIT)
        status = dead.status()
        assert status is not None
        assert status.state == "dead"  # again, kept until 1100
        clock.advance(200)  # the three done records expired at 600
        assert queue.dispatch(SumJob([9])).result(WAIT) == {"sum": 9}
        assert queue.kept_records() == 2
        assert [handle.status() for handle in done] == [None, None, None]
        # Four more: beyond MAX_RECORDS the soonest to expire go first, the dead letter (1100) before the rest.
        later = [queue.dispatch(SumJob([n])) for n in range(4)]
        assert queue.join(WAIT)
        assert queue.kept_records() == 4
        assert dead.status() is None
        assert all(handle.status() is not None for handle in later)


def test_result_waits_for_a_job_whose_dispatch_is_not_committed_yet(make_queue: QueueFactory) -> None:
    queue = queue_with(make_queue)
    prepared = queue.prepare(SumJob([8, 9]))
    handle = queue.handle(prepared.id)
    assert handle.status() is None
    with queue:
        submit = threading.Thread(target=prepared.submit)
        submit.start()
        assert handle.result(WAIT) == {"sum": 17}
        submit.join(WAIT)


@pytest.mark.parametrize("bad", [-1, float("inf"), "10", True])
def test_a_bad_keep_result_is_refused_where_it_is_written(bad: object) -> None:
    with pytest.raises(TypeError, match=rf"job class .*Bad: KEEP_RESULT must be a number of seconds >= 0, got {bad!r}"):

        class Bad(SumJob):
            NAME = "tests.bad_keep"
            KEEP_RESULT = bad  # type: ignore[assignment]

    with pytest.raises(ValueError, match="keep_result must be a number of seconds >= 0"):
        syncjobs.InMemoryJobQueue(keep_result=bad)  # type: ignore[arg-type]
    queue = syncjobs.InMemoryJobQueue(workers=0)
    with pytest.raises(TypeError, match="KEEP_RESULT must be a number of seconds >= 0"):

        @queue.task(name="tests.kept", keep_result=bad)  # type: ignore[arg-type]
        def kept() -> None: ...


def test_a_tasks_return_value_is_its_result_and_its_keep_result_its_own() -> None:
    queue = syncjobs.InMemoryJobQueue(workers=1, keep_result=0)

    @queue.task(name="tests.add", keep_result=60)
    def add(a: int, b: int) -> int:
        return a + b

    with queue:
        handle = add.dispatch(2, b=3)
        assert isinstance(handle, JobHandle)
        assert handle.result(WAIT) == 5
    status = handle.status()
    assert status is not None
    assert (status.name, status.state, status.result) == ("tests.add", "done", 5)


# -- across processes, on the database -------------------------------------------


@pytest.mark.timeout(120)
def test_status_and_results_are_read_from_another_process(db_url: str) -> None:
    name = f"q-{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, queue=name, table=TEST_TABLE, workers=0, poll_interval=0.2)
    queue.register(SumJob)
    workers = Workers(db_url, name, table=TEST_TABLE)
    try:
        summed = queue.dispatch(SumJob([1, 2, 3]))
        failed = queue.dispatch(SumJob([1, -5]))
        assert summed.status().state == "queued"  # type: ignore[union-attr]
        workers.spawn()
        assert summed.result(WAIT) == {"sum": 6}
        with pytest.raises(JobFailed, match=r"'tests.sum' .* is dead after 1 of 5 runs: fatal: negative: -5"):
            failed.result(WAIT)
        # A queue object that dispatched nothing reads the same records.
        other = syncjobs.DatabaseJobQueue(db_url, queue=name, table=TEST_TABLE, workers=0)
        try:
            done = other.status(str(summed))
            assert done is not None
            assert (done.state, done.attempts, done.result) == ("done", 1, {"sum": 6})
            dead = other.status(str(failed))
            assert dead is not None
            assert (dead.state, dead.error) == ("dead", "fatal: negative: -5")
        finally:
            other.shutdown(grace=0)
    finally:
        workers.stop()
        queue.shutdown(grace=0)


@pytest.mark.timeout(60)
def test_the_workers_prune_expired_results_from_the_database(db_url: str) -> None:
    from tests.test_database import execute

    queue = syncjobs.DatabaseJobQueue(
        db_url, queue=f"q-{uuid.uuid4().hex[:10]}", table=TEST_TABLE, workers=1, keep_result=0.5, lease=2.0
    )
    queue.register(SumJob)
    try:
        with queue:
            handle = queue.dispatch(SumJob([7]))
            assert handle.result(WAIT) == {"sum": 7}
            # Past its keep it is gone from status() at once, and from the table at the workers' next tidy-up.
            wait_until(lambda: handle.status() is None, what="the record to expire")
            wait_until(
                lambda: (
                    execute(db_url, f"SELECT COUNT(*) FROM {TEST_TABLE}_results WHERE id = ?", (str(handle),)) == [(0,)]
                ),
                what="the expired record to be pruned",
            )
    finally:
        queue.shutdown(grace=0)


def at_version(db_url: str, version: int) -> tuple[str, syncjobs.DatabaseJobQueue]:
    """A fresh table as schema ``version`` made it, and a queue on it that runs SumJob and migrates nothing itself."""
    from tests.test_database import execute, old_ddl

    table = f"t_{uuid.uuid4().hex[:10]}"
    for statement in old_ddl(db_url, table, version):
        execute(db_url, statement)
    execute(db_url, f"INSERT INTO {table}_schema (version) VALUES ({version})")
    queue = syncjobs.DatabaseJobQueue(db_url, table=table, auto_schema=False, workers=1, poll_interval=0.2)
    queue.register(SumJob)
    return table, queue


@pytest.mark.timeout(60)
def test_a_populated_version_3_table_gains_started_at_and_results(db_url: str) -> None:
    from tests.test_database import columns, drop_tables, execute

    table, queue = at_version(db_url, 3)
    try:
        assert "started_at" not in columns(db_url, table)
        insert = (
            f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "VALUES (?, 'default', 'tests.sum', ?, 'queued', 0, 3, 0, 0)"
        )
        job_id = str(uuid.uuid4())
        execute(db_url, insert, (job_id, '{"numbers": [20, 22]}'))
        with pytest.raises(syncjobs.QueueError, match=rf"version 3, this syncjobs needs {SCHEMA_VERSION}"):
            queue.start()
        assert queue.admin.migrate() == 3
        assert queue.admin.migrate() == SCHEMA_VERSION  # again: nothing to do
        assert "started_at" in columns(db_url, table)
        with queue:
            assert queue.result(job_id, WAIT) == {"sum": 42}
        status = queue.status(job_id)
        assert status is not None
        assert (status.state, status.attempts, status.result) == ("done", 1, {"sum": 42})
        assert status.started_at is not None
    finally:
        queue.shutdown(grace=0)
        drop_tables(db_url, table)


@pytest.mark.timeout(60)
def test_a_version_4_results_table_gains_payload_and_keeps_its_records(db_url: str) -> None:
    from tests.test_database import columns, drop_tables, execute

    table, queue = at_version(db_url, 4)
    try:
        assert "payload" not in columns(db_url, f"{table}_results")
        old = str(uuid.uuid4())
        execute(
            db_url,
            f"INSERT INTO {table}_results (id, queue, name, state, attempts, max_attempts, result, created_at, "
            "finished_at, expires_at) VALUES (?, 'default', 'tests.sum', 'done', 1, 3, ?, 0, ?, ?)",
            (old, '{"sum": 1}', time.time(), time.time() + 3600),
        )
        with pytest.raises(syncjobs.QueueError, match=rf"version 4, this syncjobs needs {SCHEMA_VERSION}"):
            queue.start()
        assert queue.admin.migrate() == 4
        assert "payload" in columns(db_url, f"{table}_results")
        kept = queue.status(old)
        assert kept is not None
        assert (kept.state, kept.result, kept.payload, kept.queue) == ("done", {"sum": 1}, None, "default")
        with queue:
            handle = queue.dispatch(SumJob([20, 22]))
            assert handle.result(WAIT) == {"sum": 42}
        done = handle.status()
        assert done is not None
        assert (done.state, done.payload) == ("done", {"numbers": [20, 22]})
    finally:
        queue.shutdown(grace=0)
        drop_tables(db_url, table)


@pytest.mark.timeout(60)
def test_on_postgresql_the_listen_for_job_ends_closes_once_no_one_waits(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from syncjobs.database import store

    if not server_url.startswith("postgresql"):
        pytest.skip("only PostgreSQL has NOTIFY")
    monkeypatch.setattr(store, "ENDS_IDLE", 0.2)
    queue = syncjobs.DatabaseJobQueue(server_url, queue=f"q-{uuid.uuid4().hex[:10]}", table=TEST_TABLE, workers=0)

    def listening() -> bool:
        return any(thread.name == "syncjobs-result-listener" for thread in threading.enumerate())

    try:
        queue.wait_finished(0.01)
        assert listening()
        wait_until(lambda: not listening(), what="the idle listener to leave")
        queue.wait_finished(0.01)  # a later wait opens it again
        assert listening()
    finally:
        queue.shutdown(grace=0)
    assert not listening(), "shutdown closed it"


def _in_condition_wait(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked in a ``threading.Condition.wait`` now."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code is threading.Condition.wait.__code__:
            return True
        frame = frame.f_back
    return False


@pytest.mark.timeout(120)
def test_on_postgresql_a_waiter_is_woken_by_the_notify_of_another_process_finishing(server_url: str) -> None:
    """The end of a job in a worker process wakes wait_finished() here, which result() waits in, at once."""
    if not server_url.startswith("postgresql"):
        pytest.skip("only PostgreSQL has NOTIFY; elsewhere result() polls with backoff")
    name = f"q-{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(server_url, queue=name, table=TEST_TABLE, workers=0)
    queue.register(SumJob)
    workers = Workers(server_url, name, table=TEST_TABLE)
    try:
        workers.spawn()
        # The first wait starts the listener, which wakes it once it LISTENs.
        queue.wait_finished(WAIT)
        for numbers in ([1, 2], [-1]):  # one done (by the completer), one dead (by its fenced write)
            waiter = threading.Thread(target=queue.wait_finished, args=(600,))  # far past any poll
            waiter.start()
            wait_until(lambda: _in_condition_wait(waiter), what="the waiter to wait")  # noqa: B023
            handle = queue.dispatch(SumJob(numbers))
            waiter.join(WAIT)
            assert not waiter.is_alive(), f"the end of {numbers} woke the waiter"
            status = handle.status()
            assert status is not None
            assert status.finished
    finally:
        workers.stop()
        queue.shutdown(grace=0)
