"""The hooks, on every backend: around each dispatch, around each run, after each run, on dead letters."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import pytest

import syncjobs
from syncjobs import Job, Outcome, QueueError, RunReport
from tests.conftest import QueueFactory
from tests.helpers import WAIT, Probe, ProbeJob, refuse_label_13, request_id
from tests.test_unique import SyncUser

pytestmark = pytest.mark.timeout(60)


def test_a_dispatch_hook_adds_to_what_travels_and_can_refuse_a_dispatch(make_queue: QueueFactory) -> None:
    queue = make_queue()
    probe = Probe()
    entered: list[int] = []

    @queue.around_dispatch
    @contextlib.contextmanager
    def tag(job: Job) -> Iterator[None]:
        assert isinstance(job, ProbeJob)
        entered.append(job.label)
        if job.label == 13:
            raise QueueError(f"job {job.NAME!r}: label 13 is refused")
        token = request_id.set(f"tagged-{job.label}")
        try:
            yield
        finally:
            request_id.reset(token)

    with queue:
        queue.dispatch(ProbeJob(probe.id, label=1))
        with pytest.raises(QueueError, match="label 13 is refused"):
            queue.dispatch(ProbeJob(probe.id, label=13))
        assert queue.join(WAIT)
    assert [(r["label"], r["request_id"]) for r in probe.runs] == [(1, "tagged-1")]  # 13 never went out
    assert entered == [1, 13]
    assert request_id.get() == "no-request"  # the hook left nothing behind in the caller


def test_a_dispatch_hook_that_fails_is_logged_and_the_job_goes_out_all_the_same(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue()
    probe = Probe()
    order: list[str] = []

    def broken_on_entry(job: Job) -> contextlib.AbstractContextManager[None]:
        raise RuntimeError("entry bug")

    @contextlib.contextmanager
    def broken_on_exit(job: Job) -> Iterator[None]:
        order.append("enter")
        yield
        order.append("exit")
        raise RuntimeError("exit bug")

    queue.around_dispatch(broken_on_entry)
    queue.around_dispatch(broken_on_exit)
    with queue:
        handle = queue.dispatch(ProbeJob(probe.id))
        assert queue.join(WAIT)
    assert [r["id"] for r in probe.runs] == [handle.id]
    assert order == ["enter", "exit"]
    failures = [
        r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "dispatch hook" in r.getMessage()
    ]
    assert len(failures) == 2
    assert "failed on entry; job 'tests.probe' goes out without it" in failures[0]
    assert "failed on exit; job 'tests.probe' was not affected" in failures[1]
    with pytest.raises(TypeError, match="around_dispatch\\(\\) takes a callable"):
        queue.around_dispatch("not a hook")  # type: ignore[arg-type]


def test_observers_see_each_run_with_its_report_and_one_that_raises_changes_nothing(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(1)  # one worker: the retry's report comes before its next run begins
    probe = Probe("crash", "ok")
    probe.wait = 0.0  # retried at once
    reports: list[RunReport] = []
    seen = threading.Event()

    def broken(report: RunReport) -> None:
        raise RuntimeError("observer bug")

    def collect(report: RunReport) -> None:
        reports.append(report)
        if report.outcome is Outcome.DONE:
            seen.set()

    queue.observe_runs(broken)
    queue.observe_runs(collect)
    queue.observe_runs(collect)  # the same observer is called once
    with queue:
        handle = queue.dispatch(ProbeJob(probe.id))
        assert seen.wait(WAIT)
    assert [(r.id, r.name, r.attempt, r.outcome) for r in reports] == [
        (handle.id, "tests.probe", 1, Outcome.RETRY),
        (handle.id, "tests.probe", 2, Outcome.DONE),
    ]
    assert reports[0].error == "job raised ValueError: boom"
    assert reports[0].retry_in == 0.0
    assert all(r.duration >= 0 and r.max_attempts == syncjobs.DEFAULT_MAX_ATTEMPTS for r in reports)
    assert sum("run observer" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records) == 2


def test_a_run_wrapper_is_entered_around_each_run_and_one_that_fails_fails_only_that_run(
    make_queue: QueueFactory,
) -> None:
    queue = make_queue()
    probe = Probe()
    probe.wait = 0.0
    entries: list[str | None] = []
    fail_next = [True]

    @contextlib.contextmanager
    def around() -> Iterator[None]:
        info = syncjobs.current_job()
        entries.append(info.id if info is not None else None)
        if fail_next.pop() if fail_next else False:
            raise RuntimeError("wrapper bug")
        yield

    queue.wrap_runs(around)
    letters: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(letters.append)
    with queue:
        handle = queue.dispatch(ProbeJob(probe.id))
        assert queue.join(WAIT)
    # The first run failed in the wrapper, before the job ran; the retry ran it.
    assert entries == [handle.id, handle.id]
    assert [r["attempt"] for r in probe.runs] == [1]
    assert letters == []


def test_dispatch_observers_see_each_job_enqueued_and_one_that_raises_changes_nothing(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(0)
    queue.register(SyncUser)
    seen: list[str] = []

    def broken(name: str) -> None:
        raise RuntimeError("observer bug")

    queue.around_dispatch(refuse_label_13)

    queue.observe_dispatches(broken)
    queue.observe_dispatches(seen.append)
    queue.observe_dispatches(seen.append)  # the same observer is called once
    probe = Probe()
    handles = [queue.dispatch(ProbeJob(probe.id)), queue.dispatch(ProbeJob(probe.id), delay=3600)]
    with pytest.raises(QueueError, match="label 13"):
        queue.dispatch(ProbeJob(probe.id, label=13))
    first = queue.dispatch(SyncUser(7))
    assert queue.dispatch(SyncUser(7)).duplicate  # nothing enqueued: not seen
    prepared = queue.prepare(ProbeJob(probe.id))
    assert seen == ["tests.probe", "tests.probe", "tests.unique.sync_user"]  # a prepared job, once submitted
    prepared.submit()
    assert seen[-1] == "tests.probe"
    assert len(seen) == 4
    assert queue.pending_count() == 4  # every job the observers saw, and the failing one changed nothing
    assert not first.duplicate
    assert len(handles) == 2
    assert sum("dispatch observer" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records) == 4


def test_a_dead_letter_callback_given_twice_is_called_once(make_queue: QueueFactory) -> None:
    queue = make_queue()
    letters: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(letters.append)
    queue.on_dead_letter(letters.append)  # a new bound method each time, of the same list: the same callback
    probe = Probe("fatal")
    with queue:
        handle = queue.dispatch(ProbeJob(probe.id))
        assert queue.join(WAIT)
    assert [letter.job_id for letter in letters] == [handle.id]
