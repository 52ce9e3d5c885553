"""Per-job timeouts: the cancel token at the deadline, a failed run, a pool that keeps its width."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid

import pytest

import syncjobs
from syncjobs.status import Progress
from tests.conftest import Backend, QueueFactory
from tests.helpers import WAIT, FakeClock, Probe, ProbeJob, wait_until

pytestmark = pytest.mark.timeout(60)

#: The timeout of the jobs below, in seconds of the queue's clock (real seconds on a database).
TIMEOUT = 0.3
#: Barriers the Meet jobs wait at, by key: a job is rebuilt from JSON, so it carries the key.
BARRIERS: dict[str, threading.Barrier] = {}


class Timed(ProbeJob):
    NAME = "tests.timed"
    MAX_ATTEMPTS = 3
    TIMEOUT = TIMEOUT


class TimedOnce(ProbeJob):
    NAME = "tests.timed_once"
    MAX_ATTEMPTS = 1
    TIMEOUT = TIMEOUT


@dataclasses.dataclass
class Meet(syncjobs.Job):
    """Runs only once every party of its barrier is there: proof that they run at the same time."""

    NAME = "tests.meet"
    key: str

    def run(self) -> None:
        BARRIERS[self.key].wait(WAIT)


def dead_letters(queue: syncjobs.JobQueue) -> list[syncjobs.DeadLetter]:
    letters: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(letters.append)
    return letters


def test_a_run_past_its_timeout_is_cancelled_fails_and_is_retried(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(workers=1)
    queue.register(Timed)
    probe = Probe("cooperate", "ok", wait=0.0)
    with queue:
        job_id = queue.dispatch(Timed(probe.id))
        assert queue.join(WAIT)
    assert probe.attempts == [0, 1]
    assert probe.runs[0]["info"].cancelled.is_set(), "the first run's token was set at its deadline"
    assert not probe.runs[1]["info"].cancelled.is_set()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [(r.name, r.getMessage()) for r in warnings]
    [warning] = warnings
    assert warning.getMessage().startswith(f"job tests.timed ({job_id}) timed out after 0.3s: cancelled")
    assert getattr(warning, "job_id", None) == job_id


def test_a_run_that_ignores_its_token_is_dead_lettered_and_the_pool_keeps_its_width(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(workers=2)
    queue.register(TimedOnce)
    queue.register(Meet)
    letters = dead_letters(queue)
    stuck = Probe("block")  # ignores its token, as a job blocked in a C call would
    key = uuid.uuid4().hex
    BARRIERS[key] = threading.Barrier(3)
    try:
        with queue:
            job_id = queue.dispatch(TimedOnce(stuck.id))
            stuck.wait_runs(1)
            wait_until(lambda: len(letters) == 1, what="the timed-out run's dead letter")
            assert letters[0].job_id == job_id
            assert letters[0].error == "timed out after 0.3s"
            assert letters[0].attempts == 1
            assert stuck.finished == [], "the run is still stuck in its job"
            # Two jobs that can only finish together: both workers serve, though one thread is stuck.
            queue.dispatch(Meet(key))
            queue.dispatch(Meet(key))
            BARRIERS[key].wait(WAIT)
            assert queue.join(WAIT)
            # The stuck run ends now: its late success changes nothing.
            stuck.release.set()
            stuck.wait_finished(1)
            wait_until(
                lambda: any("late finish of abandoned job" in r.getMessage() for r in caplog.records),
                what="the late outcome to be dropped",
            )
            assert queue.pending_count() == 0
            wait_until(lambda: len(queue.worker_threads()) == 2, what="the stuck worker to leave")
        assert len(letters) == 1
        if hasattr(queue, "dead_letters"):
            assert [d.job_id for d in queue.dead_letters()] == [job_id]
    finally:
        stuck.release.set()
        BARRIERS.pop(key).abort()


class TimedLonger(ProbeJob):
    """Times out after 2 s: time enough, on a busy machine, to look at its retry's run before that times out too."""

    NAME = "tests.timed_longer"
    MAX_ATTEMPTS = 3
    TIMEOUT = 2.0


def test_what_a_timed_out_run_reports_later_is_not_the_jobs_progress(make_queue: QueueFactory) -> None:
    queue = make_queue(workers=2)
    queue.register(TimedLonger)
    probe = Probe("block", "cooperate")  # the first run ignores its token; the retry waits for release
    try:
        with queue:
            job_id = queue.dispatch(TimedLonger(probe.id))
            probe.wait_runs(2)  # the first run timed out, still stuck in its job; the retry runs
            abandoned: syncjobs.RunInfo = probe.runs[0]["info"]
            abandoned.progress(99, 100, "late")  # as the stuck job would, once it goes on
            assert abandoned.latest_progress == Progress(99, 100, "late")
            status = queue.status(job_id)
            assert status is not None
            # A database marks a run it had prefetched 'running' with its next claim: 'retrying' until then.
            assert status.state in ("running", "retrying"), status
            assert status.attempts == 1, status
            assert status.progress is None, "the retry reported nothing; the abandoned run's report is not its"
            probe.release.set()
            assert queue.join(WAIT)
    finally:
        probe.release.set()


def test_shutdown_does_not_wait_for_a_worker_stuck_in_a_timed_out_run(make_queue: QueueFactory) -> None:
    queue = make_queue(workers=1)
    queue.register(TimedOnce)
    letters = dead_letters(queue)
    stuck = Probe("block")
    try:
        queue.start()
        queue.dispatch(TimedOnce(stuck.id))
        wait_until(lambda: len(letters) == 1, what="the timed-out run's dead letter")
        began = time.monotonic()
        queue.shutdown(grace=WAIT)
        assert time.monotonic() - began < WAIT / 2, "a worker stuck in a run already timed out is not waited for"
    finally:
        stuck.release.set()


def test_a_run_timed_out_during_the_shutdown_grace_is_failed_off_the_deadline_thread(
    make_queue: QueueFactory,
) -> None:
    """The deadline thread serves every other deadline: a dead letter's callback never runs on it."""
    queue = make_queue(workers=1)
    queue.register(TimedOnce)
    threads: list[str] = []
    queue.on_dead_letter(lambda letter: threads.append(threading.current_thread().name))
    stuck = Probe("block")
    try:
        queue.start()
        queue.dispatch(TimedOnce(stuck.id))
        stuck.wait_runs(1)
        # The grace outlasts the timeout: the run times out while shutdown waits for it.
        stopper = threading.Thread(target=queue.shutdown, kwargs={"grace": WAIT})
        stopper.start()
        stopper.join(WAIT)
        assert not stopper.is_alive()
        assert len(threads) == 1, "the failure is applied before shutdown returns"
        assert threads[0] != "syncjobs-deadlines"
    finally:
        stuck.release.set()


class _NoSpares(threading.Thread):
    """A spare worker's thread cannot start while ``REFUSE`` is set, as when a process is out of threads."""

    REFUSE = threading.Event()

    def start(self) -> None:
        if self.REFUSE.is_set() and self.name.startswith("syncjobs-worker-spare"):
            raise RuntimeError("can't start new thread")
        super().start()


def test_a_spare_that_cannot_start_is_started_later_so_the_pool_regains_its_width(
    make_queue: QueueFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(workers=2)
    queue.register(TimedOnce)
    queue.register(Meet)
    queue.register(ProbeJob)
    letters = dead_letters(queue)
    stuck, after = Probe("block"), Probe()
    key = uuid.uuid4().hex
    BARRIERS[key] = threading.Barrier(3)
    monkeypatch.setattr(threading, "Thread", _NoSpares)
    try:
        with queue:
            _NoSpares.REFUSE.set()
            queue.dispatch(TimedOnce(stuck.id))
            wait_until(lambda: len(letters) == 1, what="the timed-out run's dead letter, written without a spare")
            assert any("no spare worker could start" in r.getMessage() for r in caplog.records)
            _NoSpares.REFUSE.clear()
            # The one worker still serving starts the missing spare after its next run.
            queue.dispatch(ProbeJob(after.id))
            after.wait_finished(1)
            wait_until(
                lambda: any("full width again" in r.getMessage() for r in caplog.records),
                what="the spare to start",
            )
            queue.dispatch(Meet(key))
            queue.dispatch(Meet(key))
            BARRIERS[key].wait(WAIT)  # two workers serve again, beside the stuck one
            assert queue.join(WAIT)
    finally:
        _NoSpares.REFUSE.clear()
        stuck.release.set()
        BARRIERS.pop(key).abort()


def test_with_one_worker_and_no_spare_the_freed_worker_serves_again(
    make_queue: QueueFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No other worker finishes a run to start the missing spare: the stuck one, once its job returns, serves."""
    queue = make_queue(workers=1)
    queue.register(TimedOnce)
    queue.register(ProbeJob)
    letters = dead_letters(queue)
    stuck, after = Probe("block"), Probe()
    monkeypatch.setattr(threading, "Thread", _NoSpares)
    try:
        with queue:
            _NoSpares.REFUSE.set()
            queue.dispatch(TimedOnce(stuck.id))
            wait_until(lambda: len(letters) == 1, what="the timed-out run's dead letter")
            queue.dispatch(ProbeJob(after.id))
            stuck.release.set()  # the job returns at last: its worker is free, and owed
            after.wait_finished(1)
            assert queue.join(WAIT)
    finally:
        _NoSpares.REFUSE.clear()
        stuck.release.set()


def test_the_job_then_the_task_then_the_queue_decides_the_timeout(backend: Backend) -> None:
    clock = FakeClock(0.0)
    queue = backend.make(workers=3, clock=clock, timeout=100.0)
    queue.register(Timed)
    queue.register(OnceProbe)
    seen: list[tuple[str, bool]] = []
    task_started = threading.Event()

    @queue.task(name="tests.timed_task", timeout=20, max_attempts=1)
    def timed_task() -> None:
        info = syncjobs.current_job()
        assert info is not None
        task_started.set()
        seen.append(("task", info.cancelled.wait(WAIT)))

    letters = dead_letters(queue)
    plain, own = Probe("cooperate", "ok"), Probe("cooperate", "ok")
    with queue:
        plain_id = queue.dispatch(OnceProbe(plain.id))
        own_id = queue.dispatch(Timed(own.id))
        task_id = timed_task.dispatch()
        plain.wait_runs(1)
        own.wait_runs(1)
        assert task_started.wait(WAIT)
        clock.advance(TIMEOUT)  # the job's own TIMEOUT
        own.wait_finished(1)
        assert [r["id"] for r in plain.finished] == []
        clock.advance(20 - TIMEOUT)  # the task's
        wait_until(lambda: seen == [("task", True)], what="the task's run cancelled at 20 s")
        assert plain.finished == []
        clock.advance(80)  # the queue's default
        plain.wait_finished(1)
        wait_until(lambda: len(letters) == 2, what="two dead letters")
    assert {(d.job_id, d.error) for d in letters} == {
        (plain_id, "timed out after 100s"),
        (task_id, "timed out after 20s"),
    }
    assert own_id


def test_timed_out_runs_leave_no_threads_behind_once_their_jobs_return(backend: Backend) -> None:
    clock = FakeClock(0.0)
    queue = backend.make(workers=2, clock=clock)
    queue.register(TimedOnce)
    letters = dead_letters(queue)
    before = {t for t in threading.enumerate() if t.name.startswith("syncjobs-worker")}
    with queue:
        for round_ in range(1, 11):
            stuck = Probe("block")
            queue.dispatch(TimedOnce(stuck.id))
            stuck.wait_runs(1)
            clock.advance(TIMEOUT)
            wait_until(lambda: len(letters) == round_, what=f"dead letter {round_}")  # noqa: B023
            stuck.release.set()
            stuck.wait_finished(1)
        workers = {t for t in threading.enumerate() if t.name.startswith("syncjobs-worker")} - before
        # The two serving, and at most the two first threads, idle in their executor.
        wait_until(lambda: len(queue.worker_threads()) == 2, what="two workers serving")
        assert len([t for t in workers if t.is_alive()]) <= 4


def test_a_slow_dead_letter_callback_delays_no_other_timeout(backend: Backend) -> None:
    clock = FakeClock(0.0)
    queue = backend.make(workers=2, clock=clock)
    queue.register(TimedOnce)
    first, second = Probe("block"), Probe("block")
    unblock = threading.Event()
    letters: list[str] = []

    def slow_for_the_first(dead: syncjobs.DeadLetter) -> None:
        letters.append(dead.job_id)
        if dead.job_id == first_id:
            assert unblock.wait(WAIT)

    queue.on_dead_letter(slow_for_the_first)
    try:
        with queue:
            first_id = queue.dispatch(TimedOnce(first.id))
            first.wait_runs(1)
            clock.advance(TIMEOUT / 2)
            second_id = queue.dispatch(TimedOnce(second.id))
            second.wait_runs(1)
            clock.advance(TIMEOUT / 2)
            wait_until(lambda: letters == [first_id], what="the first dead letter, whose callback blocks")
            clock.advance(TIMEOUT / 2)
            wait_until(lambda: letters == [first_id, second_id], what="the second, while the first's still blocks")
            unblock.set()
    finally:
        unblock.set()
        first.release.set()
        second.release.set()


class OnceProbe(ProbeJob):
    NAME = "tests.once_probe"
    MAX_ATTEMPTS = 1


@pytest.mark.parametrize("bad", [0, -1, "5", True, float("inf"), float("nan")])
def test_a_bad_timeout_is_refused_where_it_is_written(bad: object) -> None:
    with pytest.raises(TypeError, match=r"job class .*Bad: TIMEOUT must be a number of seconds > 0 \(or None\)"):

        class Bad(syncjobs.Job):
            NAME = "tests.bad_timeout"
            TIMEOUT = bad  # type: ignore[assignment]

    queue = syncjobs.InMemoryJobQueue(workers=0)
    with pytest.raises(ValueError, match=r"timeout must be a number of seconds > 0"):
        syncjobs.InMemoryJobQueue(workers=0, timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"TIMEOUT must be a number of seconds > 0"):
        queue.task(name="tests.bad", timeout=bad)(lambda: None)  # type: ignore[arg-type]
    assert queue.registered_names() == []


def test_check_raises_cancelled_once_the_run_is_asked_to_stop() -> None:
    info = syncjobs.RunInfo("id", "name", 0, 1)
    info.check()  # not asked: nothing happens
    info.cancel()
    with pytest.raises(syncjobs.Cancelled):
        info.check()
    assert info.cancelled.is_set()
